"""The GPU check for the default engine (``--engine llama_cpp``), in one command: glmserve and
llama.cpp's ``llama-server`` on the same GLM-shaped GGUF, all layers offloaded and with the MoE
experts kept in host memory (``--cpu-moe``), in ABBA rounds (docs/engineering/measuring.md).

The model (no GLM weights can be fetched where this runs): the trained tiny GLM-4.5 of
``benchmarks/mtp.py`` zero-padded by ``widened_glm`` (``tests/hf_models.py``) to ``--hidden-size``
with ``--leading-layers`` zero layers in front, so a decode step reads as many bytes as a model
of that width (the default: 2048 wide, 30 leading layers, ~1.5 GB of f16), converted by
llama.cpp's own converter.

For each placement (``--n-gpu-layers all``; ``all`` with ``--cpu-moe``: every expert tensor in host
memory, the placement of a MoE model larger than the GPU), each round starts
glmserve and llama-server in turn (``rounds.alternate``: ABBA), runs ``glmserve bench``
(streaming, greedy, ignore_eos) at ``--concurrency`` (1 and 8), then times one ``--agent-prompt``
token prompt answered with one token (TTFT of an agent's first turn). Both servers get
``--n-ctx`` per sequence and 8 sequences (llama-server: ``-c 8 x n_ctx -np 8``). Reported: output
tok/s and TTFT medians, glmserve / llama-server as the median of per-round ratios, and each
server's start log line on offload (glmserve's ``llama.cpp backend ...``, llama-server's
``offloaded N/M layers``).

On a machine with an NVIDIA GPU and no network, ``benchmarks/gpu_check_llama_cpp.sh`` builds
llama.cpp for that GPU and runs this, from what ``python benchmarks/gpu_carry.py --engine
llama_cpp`` packs here (its header says how):

    bash benchmarks/gpu_check_llama_cpp.sh --rounds 2

On a CPU build it runs too (both servers offload nothing; a check of the script, not of a GPU):

    bash benchmarks/gpu_check_llama_cpp.sh --cpu --hidden-size 256 --leading-layers 2 --agent-prompt 2048 \
        --n-ctx 4096 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
from rounds import alternate, check_rounds, medians, paired, paired_text, per_round, save, stream_chat, table  # noqa: I001

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from glmserve.bench.client import make_prompt  # noqa: E402
from glmserve.bench.report import hardware  # noqa: E402
from glmserve.testing import RemoteServer  # noqa: E402
from mtp import ANSWER, MODEL, QUESTION  # noqa: E402
from tests.hf_models import converted_gguf, tiny_glm_mtp_trained, widened_glm  # noqa: E402


def build(root: Path, hidden_size: int, leading_layers: int, converter: Path) -> Path:
    """The widened trained GLM-4.5 as an f16 GGUF under ``root``, by llama.cpp's ``converter``."""
    folder = tiny_glm_mtp_trained(root / MODEL, QUESTION, ANSWER)
    wide = widened_glm(folder, root / f"{MODEL}-wide", hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                       moe_intermediate_size=hidden_size, leading_layers=leading_layers)
    return converted_gguf(wide, root / f"{MODEL}.gguf", converter, tokenizer_pre="glm4", outtype="f16")


def sized_prompt(gguf: Path, n_tokens: int) -> str:
    """Words of ``make_prompt`` cut until the model's own tokenizer (llama.cpp's, vocabulary only)
    makes about ``n_tokens`` of them (this tiny GLM's vocabulary splits a word into several)."""
    from llama_cpp import Llama

    vocab = Llama(str(gguf), vocab_only=True, verbose=False)
    words = make_prompt(n_tokens, random.Random(0)).split(" ")
    while len(words) > 1:
        count = len(vocab.tokenize(" ".join(words).encode(), add_bos=False))
        if count <= n_tokens:
            break
        words = words[:max(1, int(len(words) * n_tokens / count * 0.98))]
    return " ".join(words)


def agent_ttft(url: str, prompt: str, seed: int) -> float:
    """ms from sending ``prompt`` (a number ``seed`` in front, so that no cache holds it) to its
    one-token reply's end (prefill + 1 token)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{seed} {prompt}"}],
            "max_tokens": 1, "temperature": 0, "stream": True}

    async def go() -> dict:
        async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
            return await stream_chat(client, body)

    done = asyncio.run(go())
    return (done["end"] - done["start"]) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="llama-server built from the same llama.cpp")
    ap.add_argument("--hidden-size", type=int, default=2048)
    ap.add_argument("--leading-layers", type=int, default=30)
    ap.add_argument("--converter", type=Path, default=Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py",
                    help="llama.cpp's convert_hf_to_gguf.py (make install extracts it here)")
    ap.add_argument("--results", type=Path, default=None, help="where the report goes (default benchmarks/results)")
    ap.add_argument("--n-ctx", type=int, default=20480, help="per sequence (8 sequences)")
    ap.add_argument("--agent-prompt", type=int, default=16384, help="tokens of the first-turn prompt")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    args = ap.parse_args()
    if not args.converter.is_file():
        raise SystemExit(f"gpu_check_llama_cpp: no converter at {args.converter} (give --converter)")
    with tempfile.TemporaryDirectory() as folder:
        run(args, build(Path(folder), args.hidden_size, args.leading_layers, args.converter))


def run(args: argparse.Namespace, gguf: Path) -> None:
    placements = {"all layers": ([], []), "all, --cpu-moe": (["--cpu-moe"], ["--cpu-moe"])}
    lines, stats, logs = [], {}, {}
    prompt = sized_prompt(gguf, args.agent_prompt)
    for placement, (ours_extra, theirs_extra) in placements.items():
        names = [f"glmserve ({placement})", f"llama-server ({placement})"]
        ttft: dict[str, list[float]] = {name: [] for name in names}

        def start(name: str) -> RemoteServer:
            if name.startswith("glmserve"):
                return RemoteServer("--model", str(gguf), "--served-model-name", MODEL, "--n-ctx", str(args.n_ctx),
                                    "--max-num-seqs", "8", "--kv-layout", "split", "--n-gpu-layers", "all",
                                    *ours_extra, n_threads=None, startup_timeout=600)
            return RemoteServer(command=[args.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "-a", MODEL,
                                         "-c", str(8 * args.n_ctx), "-np", "8", "--no-kv-unified", "-ngl", "all",
                                         "--no-webui", *theirs_extra], startup_timeout=600)

        def after(name: str, server: RemoteServer) -> None:
            ttft[name].append(agent_ttft(server.url, prompt, seed=len(ttft[name])))
            logs[name] = [line for line in server.log().splitlines()
                          if "llama.cpp backend" in line or "offloaded" in line][-2:]

        rows = alternate(names, start, args.rounds, args.concurrency, args.input_len, args.output_len, MODEL, after)
        stats[placement] = {name: {c: medians(r, c) for c in args.concurrency} for name, r in rows.items()}
        lines += [f"### {placement}", "", *table(stats[placement], args.concurrency), ""]
        for c in args.concurrency:
            ratio = paired(per_round(rows[names[0]], c), per_round(rows[names[1]], c))
            stats[placement][names[0]][c]["paired_throughput"] = ratio
            lines.append(f"- c={c}: output tok/s glmserve / llama-server {paired_text(ratio)} (target >= 1.0)")
        ratio = paired(ttft[names[0]], ttft[names[1]])
        stats[placement]["agent_ttft_ms"] = {name: ttft[name] for name in names}
        lines.append(f"- TTFT of a {args.agent_prompt}-token prompt (+1 token), ms: glmserve "
                     f"{statistics.median(ttft[names[0]]):.0f}, llama-server {statistics.median(ttft[names[1]]):.0f}; "
                     f"glmserve / llama-server {paired_text(ratio)} (target <= 1.0)")
        lines += ["", "Offload, as each server logged it:", "", *[f"- {n}: {' | '.join(v)}" for n, v in logs.items()
                                                                if n in names], ""]
    report = "\n".join([
        f"hardware: {hardware()} | model: trained tiny GLM-4.5 widened to hidden {args.hidden_size} with "
        f"{args.leading_layers} leading layers ({gguf.stat().st_size / 2**30:.2f} GiB f16 GGUF) | 8 sequences of "
        f"{args.n_ctx} tokens | input ~{args.input_len} tokens, output {args.output_len} (ignore_eos, greedy) | "
        f"{args.rounds} rounds in ABBA order; medians, ratios as the median of per-round ratios", "", *lines])
    save("gpu_check_llama_cpp", "GPU check: glmserve (llama_cpp) vs llama-server", report, stats,
         command=" ".join(["python benchmarks/gpu_check_llama_cpp.py", *sys.argv[1:]]), folder=args.results)


if __name__ == "__main__":
    main()
