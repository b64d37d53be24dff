"""Offload placement against llama-server's ``--fit``, on stand-in GPUs: llama.cpp's
``rpc-server`` with its memory capped (``tests/rpc_devices.py``; ``make llama-tools`` builds it),
which llama.cpp uses as a GPU and which counts what it holds. For each case glmserve
(``--n-gpu-layers auto``) and llama-server (its fit on, as by default) start on identical devices
and answer once; the table gives, per device, the layers each placed (those with their experts in
host memory in brackets), the peak each device held, and the context each chose.

Cases: a GLM-4.5-shaped mixture of experts (9 layers, 96 of its 105 MiB experts) on one and on two
devices; GLM-4.7-Flash's shape (47 layers, MLA) with no context given (glmserve ``--n-ctx 0``,
llama-server no ``-c``) on 4 GiB; a tiny GLM-4.5 with ``--speculative mtp`` (llama-server
``--spec-type draft-mtp``) at 16k on 40 MiB past the margin.

    python benchmarks/offload_fit.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from glmserve.bench.report import hardware  # noqa: E402
from glmserve.testing import RemoteServer  # noqa: E402
from tests.hf_models import converted_gguf, tiny_glm4, tiny_glm_with_nextn  # noqa: E402
from tests.rpc_devices import RpcDevice, tool  # noqa: E402

CONVERTER = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
_THEIRS = re.compile(r"common_params_fit_impl: +- (RPC\d+) \(.*?\): +(\d+) layers(?: \( *(\d+) overflowing\))?")
_THEIRS_LOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_THEIRS_CTX = re.compile(r"n_ctx_seq \((\d+)\)|llama_context: n_ctx += (\d+)")
_OURS = re.compile(r"^(RPC\d+): (\d+) layers(?: \((\d+) with experts in host memory\))?,", re.M)
_OURS_CTX = re.compile(r"each request may use n_ctx=(\d+)")


def models(root: Path) -> dict[str, Path]:
    """The GGUFs of the cases, built under ``root`` (``tests/hf_models.py``; about a minute)."""
    moe = tiny_glm4(root / "moe", "Glm4MoeForCausalLM", "glm-4.7.jinja", context=4096, layers=9, hidden_size=256,
                    intermediate_size=512, moe_intermediate_size=512, n_routed_experts=16)
    flash = tiny_glm4(root / "flash", "Glm4MoeLiteForCausalLM", "glm-4.7.jinja", context=202752, layers=47)
    return {"moe": converted_gguf(moe, root / "moe.gguf", CONVERTER, tokenizer_pre="glm4", outtype="f16"),
            "flash": converted_gguf(flash, root / "flash.gguf", CONVERTER, tokenizer_pre="glm4", outtype="f16"),
            "mtp": converted_gguf(tiny_glm_with_nextn(root / "mtp"), root / "mtp.gguf", CONVERTER,
                                  tokenizer_pre="glm4", outtype="f16")}


def placed(pattern: re.Pattern, log: str) -> str:
    """``RPC0 10 (6)`` per device from a log's fit lines (the last line of each device)."""
    found = {m[0]: (m[1], m[2]) for m in pattern.findall(log)}
    return ", ".join(f"{name} {n}" + (f" ({part})" if part and part != "0" else "") for name, (n, part) in found.items())


def case(gguf: Path, mibs: list[int], ours: list[str], theirs: list[str]) -> list[str]:
    """Two table rows: glmserve's and llama-server's placement of ``gguf`` on devices of ``mibs``."""
    rows = []
    for name in ("glmserve", "llama-server"):
        with ExitStack() as stack:
            devices = [stack.enter_context(RpcDevice(mib)) for mib in mibs]
            endpoints = ",".join(d.endpoint for d in devices)
            if name == "glmserve":
                server = RemoteServer("--model", str(gguf), "--rpc", endpoints, "--max-num-seqs", "1", *ours,
                                      startup_timeout=300)
            else:
                server = RemoteServer(command=[str(tool("llama-server")), "-m", str(gguf), "--host", "127.0.0.1",
                                               "-t", "2", "--rpc", endpoints, "-np", "1", "--no-webui", "-lv", "4",
                                               *theirs], startup_timeout=300)
            try:
                log = server.log()
            finally:
                server.stop()
            if name == "glmserve":
                where, ctx = placed(_OURS, log), _OURS_CTX.findall(log)[-1:]
            else:
                where = placed(_THEIRS, log) or "; ".join("/".join(m) for m in _THEIRS_LOADED.findall(log)[-1:])
                ctx = [next(v for v in m if v) for m in _THEIRS_CTX.findall(log)][-1:]
            held = ", ".join(f"{d.peak() / 2**20:.0f}" for d in devices)
            rows.append(f"| {name} | {where} | {held} | {ctx[0] if ctx else '?'} |")
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        gguf = models(Path(folder))
        cases = [
            ("MoE, 1 device of 1100 MiB, -c 4096", gguf["moe"], [1100], ["--n-ctx", "4096"], ["-c", "4096"]),
            ("MoE, 2 devices of 1060 + 1080 MiB", gguf["moe"], [1060, 1080], ["--n-ctx", "4096"], ["-c", "4096"]),
            ("GLM-4.7-Flash shape, no context given, 4096 MiB", gguf["flash"], [4096], ["--n-ctx", "0"], []),
            ("MTP context, 1064 MiB, 16k", gguf["mtp"], [1064], ["--n-ctx", "16384", "--speculative", "mtp"],
             ["-c", "16384", "--spec-type", "draft-mtp"]),
        ]
        lines = [f"hardware: {hardware()} | devices: llama.cpp rpc-servers with capped memory, margin "
                 f"(--fit-target) 1024 MiB each | one sequence", ""]
        for title, path, mibs, ours, theirs in cases:
            lines += [f"### {title}", "", "| server | layers per device (experts in host memory) | peak held, MiB | "
                      "n_ctx |", "| --- | --- | --- | --- |", *case(path, mibs, ours, theirs), ""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
