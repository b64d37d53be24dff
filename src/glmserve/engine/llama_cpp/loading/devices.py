"""ggml's devices, as the llama.cpp that llama-cpp-python loads sees them (``devices``), and
llama-server's ``--rpc HOST:PORT,...`` (``add_rpc_servers``): the devices of llama.cpp's
``rpc-server`` on other machines (or this one), which llama.cpp then uses as GPUs.

ggml's functions are looked up through the ``libllama`` llama-cpp-python loaded (from
``LLAMA_CPP_LIB_PATH`` when set, a custom llama.cpp build, else its package's ``lib/``): the
dynamic linker resolves them in the ``libggml`` that ``libllama`` itself uses, so a device
registered here is one llama.cpp loads the model on. (A wheel holds ``libggml.so`` and
``libggml.so.0`` as two files, not a link: opening ``libggml.so`` by name gives a second ggml
with a backend registry of its own.) Where the platform's linker does not search a library's
dependencies (Windows), ``libggml`` is opened with llama-cpp-python's ``load_shared_library``
from the same folder, under the platform's name (``libggml.so``, ``libggml.dylib``,
``ggml.dll``).
"""

from __future__ import annotations

import ctypes
import functools
import socket
from dataclasses import dataclass
from pathlib import Path

from glmserve.engine.base import EngineError

_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}  # ggml's enum ggml_backend_dev_type
_FUNCTIONS = [("ggml_backend_dev_count", ctypes.c_size_t, []),
              ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
              ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
              ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
              ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
              ("ggml_backend_dev_memory", None, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.POINTER(ctypes.c_size_t)]),
              ("ggml_backend_dev_buffer_type", ctypes.c_void_p, [ctypes.c_void_p]),
              ("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p]),
              ("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p]),
              ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
              ("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p]),
              ("ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
              ("ggml_backend_register", None, [ctypes.c_void_p])]
_RPC_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)  # ggml-rpc.h's ggml_backend_rpc_add_server
_rpc_servers: list[str] = []  # the endpoints registered in this process, in order


def library_folder() -> Path:
    """The folder llama-cpp-python loads llama.cpp's libraries from: ``LLAMA_CPP_LIB_PATH``,
    else its package's ``lib/``."""
    from llama_cpp import llama_cpp as bindings

    return Path(bindings._base_path)


def load_ggml(folder: Path) -> ctypes.CDLL:
    """``libggml`` from ``folder`` through llama-cpp-python's ``load_shared_library`` (the
    platform's file names). Raises ``EngineError`` naming the folder when it is not there or does
    not load."""
    from llama_cpp._ctypes_extensions import load_shared_library

    try:
        return load_shared_library("ggml", folder)
    except (OSError, RuntimeError) as exc:  # FileNotFoundError: no such file under the platform's names
        raise EngineError(f"cannot load llama.cpp's ggml library from {folder} (LLAMA_CPP_LIB_PATH, else "
                          f"llama-cpp-python's lib/): {exc}") from exc


@functools.lru_cache(maxsize=None)
def ggml() -> ctypes.CDLL:
    """ggml's functions as ``libllama`` reaches them (module docstring). Raises ``EngineError``
    (``load_ggml``)."""
    from llama_cpp import llama_cpp as bindings

    lib = ctypes.CDLL(bindings._lib._name, handle=bindings._lib._handle)  # its own function objects
    if not hasattr(lib, "ggml_backend_dev_count"):
        lib = load_ggml(library_folder())
    for name, res, args in _FUNCTIONS:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@dataclass(frozen=True)
class Device:
    """One of ggml's devices: ``name`` (``CPU``, ``CUDA0``, ``RPC0``...), ``description`` (an
    RPC device's is its server's HOST:PORT), ``kind`` (CPU, GPU, IGPU, ACCEL), ``backend`` (its
    registry: CPU, CUDA, Metal, Vulkan, RPC...), ``buffer`` (its buffer type's name, what
    ``--override-tensor`` names), ``free`` and ``total`` memory in bytes."""

    name: str
    description: str
    kind: str
    backend: str
    buffer: str
    free: int
    total: int

    def describe(self) -> str:
        """``NAME (description, F of T MiB free)`` for the start log."""
        return f"{self.name} ({self.description}, {self.free >> 20} of {self.total >> 20} MiB free)"


def devices() -> list[Device]:
    """The devices this build of llama.cpp has (with the ``--rpc`` servers added), in ggml's order,
    their memory read now."""
    lib, out = ggml(), []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(lib.ggml_backend_dev_name(dev).decode(), lib.ggml_backend_dev_description(dev).decode(),
                          _KINDS.get(lib.ggml_backend_dev_type(dev), "?"),
                          lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)).decode(),
                          lib.ggml_backend_buft_name(lib.ggml_backend_dev_buffer_type(dev)).decode(),
                          free.value, total.value))
    return out


def buffer_type(name: str) -> int:
    """The handle of the buffer type called ``name`` (``Device.buffer``). Raises ``EngineError``
    naming the ones there are."""
    lib = ggml()
    for i in range(lib.ggml_backend_dev_count()):
        buft = lib.ggml_backend_dev_buffer_type(lib.ggml_backend_dev_get(i))
        if lib.ggml_backend_buft_name(buft).decode() == name:
            return buft
    raise EngineError(f"--override-tensor: no buffer type {name!r} in this build of llama.cpp (it has: "
                      f"{', '.join(d.buffer for d in devices())})")


def add_rpc_servers(endpoints: list[str]) -> None:
    """Register the devices of llama.cpp's ``rpc-server`` at each ``HOST:PORT`` of ``endpoints``
    (llama-server's ``--rpc``, ``common/arg.cpp``'s ``add_rpc_devices``), once per process each;
    llama.cpp puts RPC devices first among the GPUs it offloads to. Raises ``EngineError`` for a
    build without the RPC backend, or a server that does not take a connection (checked first:
    llama.cpp aborts the process on one it cannot reach)."""
    lib = ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise EngineError(f"--rpc: the llama.cpp in {library_folder()} has no RPC backend; build llama-cpp-python "
                          "with CMAKE_ARGS=-DGGML_RPC=ON (make install does)")
    add = _RPC_ADD_SERVER(lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    for endpoint in endpoints:
        if endpoint in _rpc_servers:
            continue
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except (OSError, ValueError) as exc:
            raise EngineError(f"--rpc {endpoint}: no llama.cpp rpc-server answers there ({exc})") from exc
        server = add(endpoint.encode())
        if not server:
            raise EngineError(f"--rpc {endpoint}: no llama.cpp rpc-server answers there")
        lib.ggml_backend_register(server)
        _rpc_servers.append(endpoint)
