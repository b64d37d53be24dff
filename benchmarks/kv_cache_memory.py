"""A long context on a GGUF shaped as GLM-4.7-Flash: what glmserve and llama-server hold, and what
a q8_0 KV cache saves and costs against f16 (docs/engineering/measuring.md).

The model is GLM-4.7-Flash's shape with tiny weights (``tests/hf_models.py`` ``tiny_glm4``:
``Glm4MoeLiteForCausalLM``, 47 layers, a 576-wide latent KV cache, 202,752 training positions,
hidden size 64; 12 MB at f16), converted by llama.cpp's own converter: its KV cache per token is
GLM-4.7-Flash's, its weights are not, so memory is the KV cache and the process.

Memory: each context of ``--contexts`` is served by ``glmserve serve --n-ctx N`` as shipped
(``--kv-layout auto``, 8 sequences) and, with ``--llama-server``, by ``llama-server -c N`` as a user
runs it (its defaults: 4 slots sharing the N cells); each server answers one request and its
resident memory is read (the KV cache is written at start, so it is all resident).

Speed: glmserve with ``--cache-type-k/-v f16`` and ``q8_0`` at the largest context, output tok/s
and TPOT at each concurrency, in ABBA rounds (``rounds.alternate``), the ratio as the median of
per-round ratios (a "failed" stream is one of this random model's that were special tokens alone: no
text to time). Whether answers hold at q8_0 is tested on trained models
(``tests/e2e/test_glm_gguf.py``), not here: this random model's greedy replies are special tokens.

    python benchmarks/kv_cache_memory.py [--llama-server build/bin/llama-server] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx
from rounds import alternate, check_rounds, medians, memory_mib, paired, paired_text, per_round, save, table  # noqa: I001

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from glmserve.bench.report import hardware  # noqa: E402
from glmserve.testing import RemoteServer  # noqa: E402
from tests.hf_models import converted_gguf, tiny_glm4  # noqa: E402

NAME = "flash"
CELL = {"f16": 47 * 576 * 2, "q8_0": 47 * 576 // 32 * 34}  # bytes of one KV cell (MLA: K only)


def flash_gguf(folder: Path) -> Path:
    """GLM-4.7-Flash's shape with tiny weights, as a f16 GGUF in ``folder``."""
    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    hf = tiny_glm4(folder / NAME, "Glm4MoeLiteForCausalLM", "glm-4.7.jinja", context=202752, layers=47)
    return converted_gguf(hf, folder / f"{NAME}.gguf", converter, tokenizer_pre="glm4", outtype="f16")


def answered_rss(server: RemoteServer) -> float:
    """The server's VmRSS in MiB once it answered one request."""
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
        "model": NAME, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
    r.raise_for_status()
    return memory_mib(server.proc.pid)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", help="path to the llama-server binary (memory against it)")
    ap.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[32768, 65536])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=check_rounds, default=2, help="an even number (ABBA order)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run(args, flash_gguf(Path(folder)))


def run(args: argparse.Namespace, gguf: Path) -> None:
    memory = ["| context | system | KV cells | KV cache MiB (f16) | server RSS MiB | RSS / llama-server's |",
              "|---:|---|---:|---:|---:|---:|"]
    stats: dict = {"memory": {}}
    for n_ctx in args.contexts:
        row = {}
        ours = RemoteServer("--model", str(gguf), "--served-model-name", NAME, "--n-ctx", str(n_ctx),
                            "--max-num-seqs", "8")
        try:
            row["glmserve"] = answered_rss(ours)
            cells = n_ctx * 8 if f"KV cache (split): {n_ctx * 8} cells" in ours.log() else n_ctx
        finally:
            ours.stop()
        if args.llama_server:
            theirs = RemoteServer(command=[args.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "-c", str(n_ctx),
                                           "-a", NAME, "--no-webui"], startup_timeout=300)
            try:
                row["llama-server"] = answered_rss(theirs)
            finally:
                theirs.stop()
        stats["memory"][n_ctx] = row
        for system, rss in row.items():
            kv_cells = cells if system == "glmserve" else n_ctx
            ratio = f"{rss / row['llama-server']:.2f}" if "llama-server" in row else "-"
            memory.append(f"| {n_ctx} | {system} | {kv_cells} | {kv_cells * CELL['f16'] / 2**20:.0f} | {rss:.0f} | "
                          f"{ratio} |")
    n_ctx = max(args.contexts)

    def start(kind: str) -> RemoteServer:
        return RemoteServer("--model", str(gguf), "--served-model-name", NAME, "--n-ctx", str(n_ctx),
                            "--max-num-seqs", "8", "--cache-type-k", kind, "--cache-type-v", kind,
                            "--default-chat-template-kwargs", '{"enable_thinking": false}')  # content to time

    kinds = ["f16", "q8_0"]
    rows = alternate(kinds, start, args.rounds, args.concurrency, args.input_len, args.output_len, NAME)
    speed = {kind: {c: medians(r, c) for c in args.concurrency} for kind, r in rows.items()}
    checks = []
    for c in args.concurrency:
        ratio = paired(per_round(rows["q8_0"], c), per_round(rows["f16"], c))
        speed["q8_0"][c]["paired_throughput"] = ratio
        checks.append(f"- c={c}: output tok/s q8_0 / f16 {paired_text(ratio)}")
    checks.append(f"- KV bytes per token: f16 {CELL['f16']}, q8_0 {CELL['q8_0']} ({CELL['q8_0'] / CELL['f16']:.3f})")
    checks.append("- failed: streams of this random model's that were special tokens alone (<|assistant|> over and "
                  "over), which no text shows; the bench counts a stream without text as failed")
    stats["speed"] = speed
    report = "\n".join([
        f"hardware: {hardware()} | model: GLM-4.7-Flash's shape (47 layers, MLA cache 576 wide, 202752 positions), "
        f"tiny weights, f16 GGUF | glmserve as shipped (--kv-layout auto, 8 sequences); llama-server with its "
        f"defaults", "", *memory, "", f"glmserve at --n-ctx {n_ctx}, KV cache f16 against q8_0: input ~{args.input_len} "
        f"tokens, output {args.output_len} (ignore_eos, greedy); {args.rounds} rounds in ABBA order, medians, ratios "
        "as the median of per-round ratios", "", *table(speed, args.concurrency), "", *checks])
    save("kv_cache_memory", "A long context on GLM-4.7-Flash's shape: memory against llama-server, and q8_0 "
         "against f16", report, stats, command=" ".join(["python benchmarks/kv_cache_memory.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
