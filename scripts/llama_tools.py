"""Build llama.cpp's ``rpc-server`` (with a device-memory cap), ``llama-server`` and
``llama-gguf-split`` from the
vendored sources of the llama-cpp-python release installed, once per machine.

    python scripts/llama_tools.py DIR "CMAKE ARGS"   # prints the folder holding bin/

The tests use them as a stand-in GPU and its peer (``tests/rpc_devices.py``): llama.cpp treats an
RPC device as a GPU, so a model offloaded to an ``rpc-server`` really has its tensors, KV cache
and compute buffers allocated there. ``rpc-server`` has no flag to cap its memory (it reports the
host's), so the build adds one, ``GGML_RPC_DEVICE_MEMORY_MIB`` in its environment: the device
then reports that total, free = total minus what clients have allocated, and refuses an
allocation past it as a GPU out of memory does (``alloc_buffer`` answers a null buffer, the
client's load fails). It prints ``device memory held: BYTES`` on stderr at each allocation and
free (it serves one client at a time, so a test cannot ask it while the server holds it). The cap counts every device of the process together: run one device per
``rpc-server``.

The result goes to ``DIR/<key>`` where the key hashes the llama-cpp-python version, the CMake
flags and the patch, so a change of any builds anew; a build writes into a
temporary folder renamed into place. Exits non-zero with the reason on a failed build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TARGETS = ("ggml-rpc-server", "llama-gguf-split", "llama-server")
RPC = "ggml/src/ggml-rpc/ggml-rpc.cpp"
# (anchor, text added after it): the memory cap (module docstring)
PATCH = [
    ("class rpc_server {\n",
     "    // glmserve: GGML_RPC_DEVICE_MEMORY_MIB caps the memory the process's devices report and hold\n"
     "    static size_t mem_cap() {\n"
     "        static const size_t cap = [] { const char * s = getenv(\"GGML_RPC_DEVICE_MEMORY_MIB\");\n"
     "                                       return s ? (size_t) strtoull(s, nullptr, 10) << 20 : (size_t) 0; }();\n"
     "        return cap;\n"
     "    }\n"
     "    static std::atomic<size_t> & mem_used() { static std::atomic<size_t> used{0}; return used; }\n"
     "    static void mem_report() { if (mem_cap()) { fprintf(stderr, \"device memory held: %zu\\n\", mem_used().load()); } }\n"),
    ("    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(buft, request.size);\n",
     "    if (buffer != nullptr && mem_cap() && mem_used() + buffer->size > mem_cap()) {\n"
     "        GGML_LOG_ERROR(\"[%s] device memory cap: %zu MiB held, %zu MiB asked, cap %zu MiB\\n\", __func__,\n"
     "                       mem_used().load() >> 20, (size_t) (buffer->size >> 20), mem_cap() >> 20);\n"
     "        ggml_backend_buffer_free(buffer);\n"
     "        buffer = nullptr;\n"
     "    }\n"
     "    if (buffer != nullptr) { mem_used() += buffer->size; mem_report(); }\n"),
    ("    ggml_backend_dev_memory(dev, &free, &total);\n    response.free_mem = free;\n",
     "    if (mem_cap()) { response.total_mem = mem_cap(); response.free_mem = mem_cap() - std::min(mem_cap(), mem_used().load());"
     " return true; }\n"),
]
# the frees: each counted off before the buffer goes (free_buffer, and the server's destructor)
FREES = [("    ggml_backend_buffer_free(buffer);\n    buffers.erase(buffer);\n",
          "    mem_used() -= buffer->size;\n    mem_report();\n    ggml_backend_buffer_free(buffer);\n    buffers.erase(buffer);\n"),
         ("    for (auto buffer : buffers) {\n        ggml_backend_buffer_free(buffer);\n",
          "    for (auto buffer : buffers) {\n        mem_used() -= buffer->size;\n        mem_report();\n"
          "        ggml_backend_buffer_free(buffer);\n")]


def patch(source: str) -> str:
    """``ggml-rpc.cpp``'s text with the memory cap added. Raises ``SystemExit`` when an anchor is
    not found exactly once (another llama.cpp release: the patch needs a look)."""
    for anchor, added in PATCH:
        if source.count(anchor) != 1:
            raise SystemExit(f"{RPC}: expected once: {anchor.splitlines()[0]!r} (found {source.count(anchor)})")
        if added:
            source = source.replace(anchor, anchor + added)
    for old, new in FREES:
        if source.count(old) != 1:
            raise SystemExit(f"{RPC}: expected once: {old.splitlines()[0]!r}")
        source = source.replace(old, new)
    return source


def cmake_flags(cmake_args: str) -> list[str]:
    """CMake's flags for the build: static, no tests or examples, the RPC backend, then
    ``cmake_args`` (the Makefile's ``LLAMA_CMAKE_ARGS``, the backend's)."""
    return ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_RPC=ON", *cmake_args.split()]


def key(version: str, cmake_args: str) -> str:
    """The build's folder name: the version and a hash of what the build is made from."""
    h = hashlib.sha256(repr((version, cmake_flags(cmake_args), PATCH, FREES, TARGETS)).encode())
    return f"llama-tools-{version}-{h.hexdigest()[:16]}"


def build(out: Path, version: str, cmake_args: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="llama-tools-", dir=out.parent))
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(work / f"llama_cpp_python-{version}.tar.gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(work, members=members, filter="data")
        src = work / prefix
        (src / RPC).write_text(patch((src / RPC).read_text()))
        subprocess.run(["cmake", "-S", str(src), "-B", str(work / "build"), *cmake_flags(cmake_args)], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(work / "build"), "--target", *TARGETS, "-j", str(os.cpu_count() or 2)],
                       check=True, stdout=subprocess.DEVNULL)
        staged = work / "out"
        (staged / "bin").mkdir(parents=True)
        for target in TARGETS:
            shutil.copy2(work / "build" / "bin" / target, staged / "bin" / target)
        staged.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    root, cmake_args = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""
    import llama_cpp

    root.mkdir(parents=True, exist_ok=True)
    out = root / key(llama_cpp.__version__, cmake_args)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "bin" / TARGETS[-1]).exists():
            if shutil.which("cmake") is None:
                raise SystemExit("cmake not found: install it (pip install cmake, or Debian's cmake)")
            build(out, llama_cpp.__version__, cmake_args)
    print(out)


if __name__ == "__main__":
    main()
