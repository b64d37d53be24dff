"""How often the loop guard's test (``glmserve/engine/loops.py``) fires on text that is not a
loop: real code and prose, tokenized by the default model's vocabulary, read token by token as
a generation would be. For each setting (longest period, shortest repeating span, fewest
repeats) the table gives the files where it fires (the false positives: none of these files is
a model caught in a loop) and, for the first few, where and on what; then how many tokens real
loops take to be caught at the defaults.

The corpus: this checkout's ``src``, ``tests``, ``docs``, ``benchmarks`` and ``README.md``; the
running Python's standard library (its top-level modules: code by others); the licence texts
in ``/usr/share/common-licenses`` (prose), where the system has them; ``--extra`` adds files
or folders.

    python benchmarks/loop_guard_corpus.py [--extra PATH ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from llama_cpp import Llama

from glmserve.bench.report import hardware
from glmserve.engine.loops import MAX_PERIOD, MIN_REPEATS, MIN_SPAN, LoopDetector
from glmserve.models import default_model_path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".md", ".txt", ".rst", ".js", ".html", ".css", ".toml", ".yaml", ".yml", ".jinja", ".sh", ""}
SETTINGS = [(MAX_PERIOD, span, repeats) for span in (32, 64, 128, 256, 512) for repeats in (3, MIN_REPEATS, 8)]
LOOPS = {  # what reasoning models are seen to write, each repeated until caught
    "one word": " lock",
    "a phrase": " Wait, let me check the file again.",
    "a sentence": " I need to read the configuration file first, then check whether the port is already in use"
                  " by another process before starting the server.",
}


def corpus(extra: list[Path]) -> list[Path]:
    """The files read: see the module docstring."""
    roots = [ROOT / "src", ROOT / "tests", ROOT / "docs", ROOT / "benchmarks", ROOT / "README.md",
             *sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")), Path("/usr/share/common-licenses"), *extra]
    files = []
    for root in roots:
        found = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        files += [f for f in found if f.is_file() and not f.is_symlink() and f.suffix in SUFFIXES
                  and "__pycache__" not in f.parts and f.stat().st_size < 2_000_000]
    return files


def first_loop(ids: list[int], setting: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """(token index, period, span) of the first place ``setting`` fires in ``ids``, or None."""
    detector = LoopDetector(*setting)
    for i, token in enumerate(ids):
        found = detector.feed([token])
        if found:
            return i, found.period, found.span
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=Path, nargs="*", default=[], help="more files or folders to read")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    llm = Llama(str(default_model_path()), vocab_only=True, verbose=False)
    texts = {}
    for f in corpus(args.extra):
        text = f.read_text(errors="replace")
        if text.strip():
            texts[f] = llm.tokenize(text.encode(), add_bos=False, special=False)
    n_tokens = sum(map(len, texts.values()))
    kinds = {"code": sum(f.suffix == ".py" for f in texts), "other": sum(f.suffix != ".py" for f in texts)}
    print(f"hardware: {hardware()}")
    print(f"corpus: {len(texts)} files ({kinds['code']} Python, {kinds['other']} prose and other), {n_tokens:,} tokens "
          f"(the default model's vocabulary)\n")
    print("| longest period | shortest span | fewest repeats | files where it fires | rate | first ones |")
    print("|---:|---:|---:|---:|---:|---|")
    results = []
    for setting in SETTINGS:
        fired = {}
        for f, ids in texts.items():
            hit = first_loop(ids, setting)
            if hit:
                i, period, span = hit
                snippet = llm.detokenize(ids[i - min(span, 24) + 1:i + 1]).decode(errors="replace")
                fired[str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f)] = {
                    "token": i, "period": period, "span": span, "text": snippet}
        shown = "; ".join(f"{name} (period {hit['period']}: {hit['text']!r})" for name, hit in list(fired.items())[:3])
        mark = " (default)" if setting == (MAX_PERIOD, MIN_SPAN, MIN_REPEATS) else ""
        print(f"| {setting[0]} | {setting[1]}{mark} | {setting[2]} | {len(fired)} | {len(fired) / len(texts):.2%} | "
              f"{shown.replace('|', '/').replace(chr(10), ' ')} |")
        results.append({"setting": setting, "files": len(texts), "fired": fired})
    print("\n| real loop (at the defaults) | period (tokens) | tokens written before it is caught |")
    print("|---|---:|---:|")
    caught = {}
    for name, phrase in LOOPS.items():
        unit = llm.tokenize(phrase.encode(), add_bos=False)
        hit = first_loop(unit * (4 * MIN_SPAN), (MAX_PERIOD, MIN_SPAN, MIN_REPEATS))
        caught[name] = None if hit is None else hit[0] + 1
        print(f"| {name}: {phrase.strip()[:40]!r} | {len(unit)} | {caught[name]} |")
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "tokens": n_tokens, "settings": results,
                                         "caught": caught}, indent=1))


if __name__ == "__main__":
    main()
