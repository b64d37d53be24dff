"""Calls that heal (``--heal-calls``): a tool call whose arguments fail its function's JSON
schema (``{}`` for a required argument, a string for an integer: what GLM models write now and
then under load) is decoded once more from its call-start tag under a grammar that admits only
that function's calls with arguments its schema accepts (the format's ``CallGrammar``,
``serving/structured/grammar.py``, as ``tool_choice`` naming the function builds it). The retry's
prompt is the request's prompt and the reply's tokens before the call, so the engines' prefix
caches hold all but the call. One retry per call, for ``MAX_RETRIES`` calls of a reply at most:
where it fails too (no call, an error, a full engine, no room left in ``max_tokens``), the call
goes out as the model wrote it. Each is counted in ``/metrics``
(``glmserve:calls_healed_total{result}``) and logged (logger ``glmserve.chat``).

Where: formats whose calls open with a tag the vocabulary holds as one token (GLM-4.5 to 5.x's
and hermes' ``<tool_call>``; that token is where the retry starts), on engines with constrained
decoding, for replies not already under a grammar (a forced call's grammar enforces the schema).

Streaming: a call's events are held until the reply ends, then sent as they came (the
arguments in the same pieces) when they pass, or healed. A call whose arguments grow past
``WINDOW`` characters (a file's text) is released and streamed on as it comes, unchecked: the
calls that fail a schema are the short ones. Usage counts the reply's tokens, not the retry's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from contextlib import aclosing
from typing import Any

import jsonschema

from glmserve.protocol.errors import APIError
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.run import Run
from glmserve.serving.generation.tool_formats import TOOL_FORMATS
from glmserve.serving.structured.grammar import tool_call_grammar
from glmserve.serving.structured.schema_check import check_enforceable
from glmserve.toolcalls import PARSERS, DeltaEvent

log = logging.getLogger("glmserve.chat")
WINDOW = 4096  # characters of a call's arguments held for the check, at most
MAX_RETRIES = 8  # failing calls of one reply decoded again, at most (the rest are sent as written)
CALL_START = "<tool_call>"
FORMATS = ("glm47", "glm45", "hermes")  # calls that open with CALL_START


class CallHealer:
    """One reply's calls, held and checked: ``feed(events)`` -> the events to send now (calls
    held), ``await finish()`` -> the held calls at the end, each as written or healed."""

    def __init__(self, pipeline: ModelPipeline, run: Run, start_id: int) -> None:
        self.pipeline, self.run, self.start_id = pipeline, run, start_id
        self.functions = {f["name"]: (i, f) for i, f in enumerate(run.functions)}
        self.held: dict[int, list[DeltaEvent]] = {}
        self.sizes: dict[int, int] = {}
        self.released: set[int] = set()
        self.retries = 0

    def feed(self, events: list[DeltaEvent]) -> list[DeltaEvent]:
        out = []
        for e in events:
            if e.kind != "tool_call" or e.index in self.released:
                out.append(e)
                continue
            self.held.setdefault(e.index, []).append(e)
            self.sizes[e.index] = self.sizes.get(e.index, 0) + len(e.arguments or "")
            if self.sizes[e.index] > WINDOW:  # long: streamed on, unchecked
                self.released.add(e.index)
                out += self.held.pop(e.index)
        return out

    async def finish(self, unread: int) -> list[DeltaEvent]:
        """The held calls; ``unread``: calls the parser could not read (their tags are in the
        tokens too, so no call is healed: which tag starts which call is not known)."""
        out = []
        n_calls = len(self.held) + len(self.released)
        for index in sorted(self.held):
            events = self.held[index]
            name = next((e.name for e in events if e.name), "")
            arguments = "".join(e.arguments or "" for e in events)
            if name not in self.functions or _valid(self.functions[name][1], arguments):
                out += events
                continue
            self.retries += 1
            healed = None if unread or self.retries > MAX_RETRIES else await self._retry(index, name, n_calls)
            self.pipeline.metrics.healed.labels(self.run.model, "healed" if healed else "failed").inc()
            log.warning("%s: call %d to %s: arguments %s fail its schema; %s", self.run.request.request_id, index,
                        name, arguments[:200], f"healed: {healed[:200]}" if healed else "sent as written")
            out += [DeltaEvent("tool_call", index=index, name=name, arguments=healed)] if healed else events
        self.held.clear()
        return out

    async def _retry(self, index: int, name: str, n_calls: int) -> str | None:
        """The call decoded again under its function's grammar: its arguments (JSON), or None."""
        run, pipeline = self.run, self.pipeline
        starts = [i for i, t in enumerate(run.token_ids) if t == self.start_id]
        at, fn = self.functions[name]
        param = f"tools.{at}.function.parameters"
        left = run.request.sampling.max_tokens - starts[index] if len(starts) == n_calls else 0
        if left < 1:
            return None
        try:
            check_enforceable(fn.get("parameters") or {}, param, pipeline.schema_limits)
            grammar = tool_call_grammar(TOOL_FORMATS[pipeline.tool_parser].grammar, [fn], [param],
                                        pipeline.schema_limits, "one")
            retry = dataclasses.replace(
                run.request, request_id=f"{run.request.request_id}-heal{index}",
                prompt_token_ids=[*run.request.prompt_token_ids, *run.token_ids[:starts[index]]],
                sampling=dataclasses.replace(run.request.sampling, grammar=grammar, max_tokens=left))
            outputs = await asyncio.to_thread(pipeline.admit, run.model, retry, asyncio.get_running_loop(), None)
        except APIError as exc:  # a schema the grammar cannot carry, a full engine
            log.info("%s: call %d not retried: %s", run.request.request_id, index, exc.message)
            return None
        text = ""
        async with aclosing(outputs) as stream:
            async for out in stream:
                if out.finish_reason == "error":
                    return None
                text += out.text
                if out.finished:
                    break
        calls = PARSERS[pipeline.tool_parser](run.functions).parse(text).tool_calls
        if len(calls) != 1 or calls[0].name != name or not _valid(fn, calls[0].arguments):
            return None
        return calls[0].arguments


def healer_for(pipeline: ModelPipeline, run: Run) -> CallHealer | None:
    """A ``CallHealer`` for ``run`` where healing applies (see the module docstring), else None."""
    start_id = next((i for i, tag in pipeline.shown_tags.items() if tag == CALL_START), None)
    if (not pipeline.heal_calls or pipeline.tool_parser not in FORMATS or start_id is None
            or not pipeline.engine.model_info.grammar or run.request.sampling.grammar is not None
            or not any(f.get("parameters") for f in run.functions)):
        return None
    return CallHealer(pipeline, run, start_id)


def _valid(fn: dict[str, Any], arguments: str) -> bool:
    """Whether ``arguments`` (JSON text) is an object its function's ``parameters`` accept, the
    schema's regular expressions left out (``pattern``, ``patternProperties``: a client's regex
    run by Python's ``re`` on the event loop could backtrack for minutes; the retry's grammar
    enforces them)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return False
    schema = _without_patterns(fn.get("parameters") or {})
    return isinstance(value, dict) and jsonschema.Draft202012Validator(schema).is_valid(value)


def _without_patterns(schema: Any) -> Any:
    """``schema`` with every ``pattern`` (a string: the keyword, not a property of that name) and
    ``patternProperties`` removed."""
    if isinstance(schema, dict):
        return {k: _without_patterns(v) for k, v in schema.items()
                if not (k == "pattern" and isinstance(v, str)) and k != "patternProperties"}
    return [_without_patterns(v) for v in schema] if isinstance(schema, list) else schema
