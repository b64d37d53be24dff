"""``benchmarks/gpu_carry.py``: the dependency closure it carries to a GPU machine follows each
wheel's requirements, extras included, down to what the device image has (a requirement reached
through an extra, ``pydantic-extra-types[pycountry]``, was missing from the first carry)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.benchmark_scripts import load



def _gpu_carry():
    return load("gpu_carry")


def _wheel(folder: Path, name: str, *requires: str) -> Path:
    path = folder / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        head = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        z.writestr(f"{name}-1.0.dist-info/METADATA", head + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_requirements_apply_by_extra_and_device_markers(tmp_path):
    wheel = _wheel(tmp_path, "pkg", "plain", 'country; extra == "pycountry"', 'win; sys_platform == "win32"',
                   'old; python_version < "3.12"')
    requires = _gpu_carry().requires
    assert [r.name for r in requires(wheel, set())] == ["plain"]
    assert [r.name for r in requires(wheel, {"pycountry"})] == ["plain", "country"]


@pytest.mark.parametrize("specs", [["app", "other"], ["other", "app"]])  # lib reached plain first, or with [more]
def test_closure_follows_extras_reached_later_and_stops_at_the_device_packages(specs, tmp_path, monkeypatch):
    index = {"app": ["lib", "torch", "have-it"], "lib": ['extra-dep; extra == "more"'], "other": ["lib[more]"],
             "extra-dep": [], "torch": ["never"], "have-it": ["never"]}
    gpu_carry = _gpu_carry()
    fetched = []

    def download(spec: str, dest: Path) -> Path:
        name = spec.split("=")[0].split("<")[0].split(">")[0]
        fetched.append(name)
        return _wheel(dest, name, *index[name])

    monkeypatch.setattr(gpu_carry, "download", download)
    wheels = gpu_carry.closure(specs, {"have-it"}, tmp_path)
    assert sorted(w.name.split("-")[0] for w in wheels) == ["app", "extra_dep", "lib", "other"]
    assert sorted(fetched) == ["app", "extra-dep", "lib", "other"]  # each downloaded once; torch is not carried


def test_the_llama_cpp_sources_keep_what_a_cuda_build_reads(tmp_path):
    """The source release loses its git objects, llama.cpp's test models and docs and the other
    backends' sources; the CUDA, CPU and RPC backends, the server, libmtmd and the converter stay."""
    kept = ["llama_cpp/llama_cpp.py", "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu",
            "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c", "vendor/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp",
            "vendor/llama.cpp/tools/server/server.cpp", "vendor/llama.cpp/tools/mtmd/clip.cpp",
            "vendor/llama.cpp/tools/ui/CMakeLists.txt", "vendor/llama.cpp/convert_hf_to_gguf.py",
            "vendor/llama.cpp/gguf-py/gguf/__init__.py"]
    dropped = [".git/modules/pack", "docs/index.md", "vendor/llama.cpp/models/ggml-vocab-llama.gguf",
               "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp", "vendor/llama.cpp/ggml/src/ggml-metal/x.m",
               "vendor/llama.cpp/tools/ui/tests/a.webp", "vendor/llama.cpp/tools/mtmd/test-3.mp4",
               "vendor/llama.cpp/tests/test-backend-ops.cpp"]
    for path in kept + dropped:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    _gpu_carry().trim(tmp_path)
    assert [p for p in kept if not (tmp_path / p).exists()] == []
    assert [p for p in dropped if (tmp_path / p).exists()] == []


def test_the_llama_cpp_gpu_check_stops_with_one_line_where_something_is_missing(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check_llama_cpp.sh"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable, "CARRY": str(tmp_path / "none"),
           "WORK": str(tmp_path / "work")}
    no_gpu = subprocess.run(["bash", str(script), "--rounds", "2"], capture_output=True, text=True, env=env)
    no_carry = subprocess.run(["bash", str(script), "--cpu"], capture_output=True, text=True, env=env)
    assert no_gpu.returncode == 2 and no_gpu.stderr.startswith("gpu_check_llama_cpp: no NVIDIA GPU")
    assert no_carry.returncode == 2 and "lacks llama.tar.xz or site.tar.xz: run python benchmarks/gpu_carry.py " \
                                       "--engine llama_cpp" in no_carry.stderr
    assert len(no_gpu.stderr.splitlines()) == len(no_carry.stderr.splitlines()) == 1
