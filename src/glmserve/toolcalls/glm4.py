"""``glm4``: GLM-4-9B-Chat and GLM-4V (source: the model's chat template and the original
GLM-4 demo server; format notes in glmserve's FORMAT.md).

After ``<|assistant|>`` the model writes either a plain answer, which starts with a newline
(empty metadata), or a call: the function name on the first line, then its JSON arguments,
then ``<|observation|>`` (an end-of-turn token). Built-in tools take other argument forms:
``simple_browser`` a Python-call-like command (``search("q", recency_days=7)``), ``cogview`` a
prompt, ``python`` code; these come back as ``{"command": ...}``, ``{"prompt": ...}`` and
``{"code": ...}`` when they are not JSON.

Streaming: content is released as soon as the first line shows it is not a tool name; a call
is held to the end of the reply (GLM-4 writes one call per turn).
"""

from __future__ import annotations

import json

from glmserve.toolcalls.base import DeltaEvent, HeadDecidedParser

BUILTIN_ARGUMENT = {"simple_browser": "command", "cogview": "prompt", "python": "code"}


class Glm4Parser(HeadDecidedParser):
    name = "glm4"
    markers = ("[gMASK]", "metadata")  # the GLM-4 template writes <|{{ role }}|>{{ metadata }}
    end_of_turn = ("<|observation|>", "<|user|>")
    always_active = True

    def _could_be_name(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.schemas)

    def _advance(self, out: list[DeltaEvent]) -> None:
        if self._mode == "call":
            return
        line, newline, _ = self._buf.partition("\n")
        if newline and self._known(line.strip()):
            self._mode = "call"
        elif newline or not self._could_be_name(line):
            self._to_content(out)

    def _decode(self) -> tuple[str, dict] | None:
        line, _, rest = self._buf.partition("\n")
        name, rest = line.strip(), rest.strip()
        try:
            arguments = json.loads(rest) if rest else {}
        except ValueError:
            arguments = {BUILTIN_ARGUMENT[name]: rest} if name in BUILTIN_ARGUMENT else None
        if not isinstance(arguments, dict):
            return None
        return name, arguments

    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._mode == "call" and (decoded := self._decode()) is not None:
            self._emit_call(*decoded, out)
        elif self._mode == "call" and truncated:
            pass  # a call cut by max_tokens: dropped, not leaked into content
        elif self._mode != "content":
            self._emit_content(self._buf, out)
        self._buf = ""
        return out
