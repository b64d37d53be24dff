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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default="0.26.0", help="the vLLM release whose CUDA wheel matches the device's torch")
    ap.add_argument("--kinds", type=Path, default=ROOT.parent / ".library" / "device" / "KINDS.md",
                    help="the device description whose 'Packages:' line lists what the image has")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-carry"), help="downloads and the site folder")
    args = ap.parse_args()

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
