"""A synthetic vLLM engine core for ``serving_overhead.py --vllm-core synthetic`` (issue 56): vLLM's
``AsyncLLM`` in the API process keeps its input processor, output processor, detokenizer and
output handler, but its engine core client is ``SyntheticCoreClient``, which runs no model: each
step gives every running request one token at once. glmserve ``--engine vllm`` and ``vllm serve``
then spend the API process's CPU on their own serving stacks only, on the same outputs, with no
engine step in them.

The steps are paced as a real engine's are when its step takes longer than the serving work
(vLLM on a CPU or at a large batch): the next step starts once the server has taken every output
of the last one from vLLM's per-request ``RequestOutputCollector``, so no server is handed merged
deltas (fewer, larger chunks) for being slower; a request whose outputs are only put at its end
(``RequestOutputKind.FINAL_ONLY``, vLLM's server's non-streamed replies) holds up no step. Tokens
are those of ordinary English text in the model's own tokenizer, so that detokenization does its
usual work. A request ends with ``FinishReason.LENGTH`` at its ``max_tokens``, as ``ignore_eos``
would have it.

``install()`` is called from ``synthetic_site/sitecustomize.py``, which ``serving_overhead.py`` puts
on both servers' ``PYTHONPATH``: it makes ``EngineCoreClient.make_async_mp_client`` build this client and
wraps the collector's ``put``, ``get`` and ``get_nowait`` to tell it what is waiting to be taken.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vllm.v1.engine import core_client
from vllm.v1.engine.output_processor import RequestOutputCollector

TEXT = ("The serving layer turns engine outputs into chunks that clients read one by one, while other requests "
        "wait for their turn on the same event loop. Each chunk carries a few characters of text, and the "
        "client joins them into the reply it shows. ")


class SyntheticCoreClient(core_client.EngineCoreClient):
    """The engine core client ``AsyncLLM`` talks to, with no engine behind it (module docstring).
    The one instance of a process is ``SyntheticCoreClient.current``."""

    current: SyntheticCoreClient | None = None

    def __init__(self, vllm_config, *args, **kwargs) -> None:
        from transformers import AutoTokenizer

        self.vllm_config = vllm_config
        self.engine_ranks_managed = [0]
        self.resources = SimpleNamespace(engine_dead=False)  # AsyncLLM.errored reads it
        model_config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer, trust_remote_code=False)
        self.tokens = tokenizer.encode(TEXT * 4, add_special_tokens=False)
        vllm_config.cache_config.num_gpu_blocks = 1 << 16  # what the engine core's handshake would set
        self.running: dict[str, list[int]] = {}  # request id -> [tokens given, max_tokens]
        self.untaken: set[str] = set()  # requests whose collector holds an output the server has not taken
        self.wake: asyncio.Event | None = None
        SyntheticCoreClient.current = self

    def _wake(self) -> asyncio.Event:
        if self.wake is None:  # bound to the loop the first await runs on
            self.wake = asyncio.Event()
        return self.wake

    def taken(self, request_id: str) -> None:
        self.untaken.discard(request_id)
        if not self.untaken:
            self._wake().set()

    async def get_output_async(self) -> EngineCoreOutputs:
        wake = self._wake()
        await asyncio.sleep(0)  # a step's outputs no one reads at once (FINAL_ONLY) still let the loop run
        while self.untaken or not self.running:
            await wake.wait()
            wake.clear()
        outputs = []
        for request_id, state in list(self.running.items()):
            given, max_tokens = state
            state[0] = given + 1
            done = given + 1 >= max_tokens
            outputs.append(EngineCoreOutput(request_id, [self.tokens[given % len(self.tokens)]],
                                            finish_reason=FinishReason.LENGTH if done else None))
            if done:
                del self.running[request_id]
        return EngineCoreOutputs(outputs=outputs, timestamp=time.monotonic())

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self.running[request.request_id] = [0, request.sampling_params.max_tokens or 16]
        if not self.untaken:
            self._wake().set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.running.pop(request_id, None)
            self.taken(request_id)

    async def get_supported_tasks_async(self):
        return ("generate",)

    async def is_sleeping_async(self) -> bool:
        return False

    async def reset_prefix_cache_async(self, *args, **kwargs) -> bool:
        return True

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_encoder_cache_async(self) -> None:
        return None

    def dp_engines_running(self) -> bool:
        return False

    def shutdown(self, timeout: float | None = None) -> None:
        self.running.clear()


def install() -> None:
    """``AsyncLLM`` builds ``SyntheticCoreClient`` from here on; the collectors report puts and takes."""
    core_client.EngineCoreClient.make_async_mp_client = staticmethod(
        lambda vllm_config, *args, **kwargs: SyntheticCoreClient(vllm_config))
    put, get, get_nowait = RequestOutputCollector.put, RequestOutputCollector.get, RequestOutputCollector.get_nowait

    def noting_put(self, output):
        put(self, output)
        SyntheticCoreClient.current.untaken.add(self.request_id)

    async def taking_get(self):
        try:
            return await get(self)
        finally:  # an output taken, or an error raised to the reader, or a reader gone
            SyntheticCoreClient.current.taken(self.request_id)

    def taking_get_nowait(self):
        output = get_nowait(self)
        if output is not None:
            SyntheticCoreClient.current.taken(self.request_id)
        return output

    RequestOutputCollector.put, RequestOutputCollector.get = noting_put, taking_get
    RequestOutputCollector.get_nowait = taking_get_nowait
