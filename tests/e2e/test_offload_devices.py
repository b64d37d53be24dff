"""Offload on devices that really hold tensors: llama.cpp's rpc-server with its memory capped
(``tests/rpc_devices.py``), which llama.cpp uses as a GPU. glmserve started with ``--rpc`` places
layers, KV cache and compute buffers there as llama-server's ``--fit`` does on an identical device
(what each device holds is counted by the rpc-server itself), a mixture of experts keeps experts in
host memory before whole layers as llama-server's fit does, a split GGUF is sized whole, a
device too small for what is asked refuses the allocation and the server says why, the draft
model follows the plan, and ``--n-gpu-layers 0`` leaves the device untouched."""

from __future__ import annotations

import re
import subprocess
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from glmserve.models import default_model_path
from tests.conftest import RemoteServer
from tests.rpc_devices import RpcDevice, offloaded, tool

MIB = 1 << 20
N_LAYER = 30  # SmolLM2-135M: 30 layers, llama.cpp offloads 31 with the output layer


def ask(server: RemoteServer) -> dict:
    """One greedy chat answer from ``server``; its model card."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    name = client.models.list().data[0].id
    reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                           temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
    return client.models.retrieve(name).model_dump()


def glmserve(model: Path, devices: list[RpcDevice], *flags: str, n_ctx: int = 4096) -> tuple[dict, str]:
    """glmserve on ``model`` with ``devices`` as ``--rpc``, ``--n-ctx n_ctx`` and ``flags`` (one
    sequence unless they say), asked once; its model card and log."""
    seqs = () if "--max-num-seqs" in flags else ("--max-num-seqs", "1")
    server = RemoteServer("--model", str(model), "--rpc", ",".join(d.endpoint for d in devices), "--n-ctx", str(n_ctx),
                          *seqs, *flags)
    try:
        return ask(server), server.log()
    finally:
        server.stop()


def llama_server_log(model: Path, devices: list[RpcDevice], *flags: str, n_ctx: int | None = 4096) -> str:
    """llama-server on ``model`` with ``devices`` and ``-c n_ctx`` (None: no ``-c``) (its ``--fit``
    on, as by default), once healthy; its log."""
    context = () if n_ctx is None else ("-c", str(n_ctx))
    server = RemoteServer(command=[str(tool("llama-server")), "-m", str(model), "--host", "127.0.0.1", "-t", "2",
                                   "--rpc", ",".join(d.endpoint for d in devices), *context, "-np", "1",
                                   "--no-webui", "-lv", "4", *flags], startup_timeout=120)
    try:
        return server.log()
    finally:
        server.stop()


def llama_server(model: Path, devices: list[RpcDevice], *flags: str, n_ctx: int = 4096) -> int:
    """``llama_server_log``'s layers offloaded."""
    return offloaded(llama_server_log(model, devices, *flags, n_ctx=n_ctx))


def test_auto_places_what_llama_servers_fit_places_on_one_device():
    model = default_model_path()
    with RpcDevice(1100) as peer, RpcDevice(1100) as ours:
        theirs = llama_server(model, [peer])
        card, log = glmserve(model, [ours])
        assert not ours.refused() and not peer.refused()
        assert 0 < theirs < N_LAYER + 1, f"the device should hold part of the model, llama-server put {theirs}"
        assert abs(card["n_gpu_layers"] - theirs) <= 1, log
        assert card["backend"] == "RPC" and any(d.startswith(f"RPC0 ({ours.endpoint}") for d in card["devices"])
        assert re.search(rf"RPC0: {card['n_gpu_layers']} layers, weights \d+ \+ KV \d+ \+ compute \d+ MiB", log)
        # what the device holds, counted by the rpc-server, against llama-server's on its twin; the
        # margin (--fit-target, 1 GiB) kept
        assert 0.8 * peer.peak() <= ours.peak() <= min(1.25 * peer.peak(), (ours.mib - 1024) * MIB)
        assert ours.held() == 0  # all freed when the server stopped


def test_two_devices_are_filled_as_llama_servers_fit_fills_them():
    model = default_model_path()
    with RpcDevice(1080) as a, RpcDevice(1120) as b, RpcDevice(1080) as pa, RpcDevice(1120) as pb:
        theirs = llama_server(model, [pa, pb])
        card, log = glmserve(model, [a, b])
        assert not any(d.refused() for d in (a, b, pa, pb))
        assert abs(card["n_gpu_layers"] - theirs) <= 1, log
        for ours, peer in ((a, pa), (b, pb)):  # device by device
            assert 0 < ours.peak() and 0.8 * peer.peak() <= ours.peak() <= 1.25 * peer.peak()


def test_a_tensor_split_given_is_kept_and_each_device_keeps_its_margin():
    """llama-server's --fit stands down when --tensor-split is given (and offloads every layer);
    glmserve keeps the shares and offloads the layers they place within every device's margin."""
    with RpcDevice(1080) as a, RpcDevice(1120) as b:
        card, log = glmserve(default_model_path(), [a, b], "--tensor-split", "1,1")
        assert 0 < card["n_gpu_layers"] < N_LAYER + 1
        for device in (a, b):
            assert 0 < device.peak() <= (device.mib - 1024) * MIB, log


def test_n_gpu_layers_0_leaves_the_device_untouched():
    with RpcDevice(4096) as device:
        card, _ = glmserve(default_model_path(), [device], "--n-gpu-layers", "0")
        assert card["n_gpu_layers"] == 0 and card["backend"] == "CPU"
        assert device.peak() == 0


def test_the_draft_model_follows_the_plan():
    """The draft model loads with --n-gpu-layers-draft (auto: on the GPUs only where every layer of
    the model is), not with llama.cpp's default of every layer on them, and what it holds there is
    in the fit: with the draft wholly on a device the model gets what the draft leaves."""
    model = default_model_path()
    draft = ("--speculative", "draft", "--draft-model", str(model))
    with RpcDevice(4096) as device:
        card, _ = glmserve(model, [device], "--n-gpu-layers", "0", *draft)
        assert card["n_gpu_layers"] == 0 and device.peak() == 0
    with RpcDevice(4096) as device:
        card, _ = glmserve(model, [device], "--n-gpu-layers", "0", "--n-gpu-layers-draft", "all", *draft)
        assert card["n_gpu_layers"] == 0 and device.peak() > 0  # the draft's layers alone
        alone = device.peak()
    # 476 MiB past the margin: the model (279 MiB with its layers, KV and compute buffer on the
    # device) or its draft fits, not both: the model's layers make room for the draft's
    with RpcDevice(1500) as device:
        card, log = glmserve(model, [device], "--n-gpu-layers-draft", "all", *draft)
        assert 0 < card["n_gpu_layers"] < N_LAYER + 1 and not device.refused(), log
        assert alone < device.peak() <= (device.mib - 1024) * MIB, (alone >> 20, device.peak() >> 20, log)


@pytest.fixture(scope="module")
def mtp_gguf(tmp_path_factory) -> Path:
    """A tiny GLM-4.5 with one NextN (MTP) layer (``tests/hf_models.tiny_glm_with_nextn``), f16."""
    pytest.importorskip("torch")
    import sys

    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_with_nextn

    root = tmp_path_factory.mktemp("mtp")
    return converted_gguf(tiny_glm_with_nextn(root / "mtp"), root / "mtp.gguf",
                          Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py", tokenizer_pre="glm4",
                          outtype="f16")


def test_the_mtp_context_is_in_the_plan(mtp_gguf):
    """--speculative mtp's context (the NextN layer's KV cells and its compute buffer, 21 MiB
    here) is fitted with the model, as llama-server fits --spec-type draft-mtp's: on a device
    with 40 MiB past the margin, where the model alone (25 MiB) fits whole, both do not."""
    with RpcDevice(1064) as peer, RpcDevice(1064) as ours:
        theirs = llama_server(mtp_gguf, [peer], "--spec-type", "draft-mtp", n_ctx=16384)
        card, log = glmserve(mtp_gguf, [ours], "--speculative", "mtp", n_ctx=16384)
        assert card["n_gpu_layers"] < 4 and abs(card["n_gpu_layers"] - theirs) <= 1, (theirs, log)
        assert not ours.refused() and ours.peak() <= (ours.mib - 1024) * MIB, (ours.peak() >> 20, log)


def test_a_device_too_small_for_what_is_asked_refuses_and_the_server_says_why():
    with RpcDevice(32) as device:
        with pytest.raises(RuntimeError) as failed:
            RemoteServer("--model", str(default_model_path()), "--rpc", device.endpoint, "--n-gpu-layers", "all")
        assert device.refused()
        log = str(failed.value)
        assert "layers offloaded: 31 on RPC0; a device may be out of memory" in log and "lower --n-gpu-layers" in log, log[-2000:]
        assert "Traceback" not in log


def test_a_context_not_given_shrinks_before_layers_leave_the_device(flash_gguf):
    """--n-ctx 0 (the training context, 202,752 tokens, 10 GiB of KV) on a 4 GiB device: the context
    shrinks until every layer fits beside the margin, as llama-server's --fit shrinks a context
    not given (-c unset), where keeping it would leave 35 of 48 layers on the host."""
    with RpcDevice(4096) as peer, RpcDevice(4096) as ours:
        peer_log = llama_server_log(flash_gguf, [peer], n_ctx=None)
        theirs = int(re.search(r"context size reduced from 202752 to (\d+)", peer_log).group(1))
        assert offloaded(peer_log) == 48
        card, log = glmserve(flash_gguf, [ours], n_ctx=0)
        assert card["n_gpu_layers"] == 48 and 0.95 * theirs <= card["max_model_len"] <= theirs, (theirs, log)
        assert "as llama-server's --fit shrinks a context not given" in log
        assert not ours.refused() and 0.95 * peer.peak() <= ours.peak() <= (ours.mib - 1024) * MIB


@pytest.fixture(scope="module")
def vision_gguf(tmp_path_factory) -> Path:
    """The tiny GLM-4.6V (``tests/hf_models.tiny_glm4v``) with its projector beside it."""
    pytest.importorskip("torch")
    import sys

    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm4v

    root = tmp_path_factory.mktemp("glm4v")
    folder, converter = tiny_glm4v(root / "hf"), Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    converted_gguf(folder, root / "gguf" / "mmproj-glm4v.gguf", converter, tokenizer_pre="glm4", mmproj=True)
    return converted_gguf(folder, root / "gguf" / "glm4v.gguf", converter, tokenizer_pre="glm4")


def test_the_vision_projector_goes_on_the_gpu_unless_kept_on_the_host(vision_gguf):
    """As llama-server's: the projector on the first GPU (its weights held there beside the
    model's, and in the plan), an image answered through it; --no-mmproj-offload keeps it in host
    memory."""
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 30, 30)).save(png, "PNG")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}}
    projector = (vision_gguf.parent / "mmproj-glm4v.gguf").stat().st_size
    held = {}
    for flags in ((), ("--no-mmproj-offload",)):
        with RpcDevice(4096) as device:
            server = RemoteServer("--model", str(vision_gguf), "--rpc", device.endpoint, "--n-ctx", "1024",
                                  "--max-num-seqs", "1", *flags)
            try:
                reply = server.client().chat.completions.create(
                    model=server.client().models.list().data[0].id, max_tokens=4, temperature=0,
                    messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}])
                assert reply.usage.prompt_tokens > 20  # the image's tokens
            finally:
                log = server.log()
                server.stop()
            held[flags] = device.peak()
            assert ("(in host memory)" in log) == bool(flags) and not device.refused()
    # the projector's weights (its file less the header) and the image's compute buffer on the device
    assert held[()] - held[("--no-mmproj-offload",)] >= 0.95 * projector, (held, projector)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """The default model split by llama-gguf-split into 4 shards of at most 70 tensors (272 in all)."""
    out = tmp_path_factory.mktemp("shards") / "smollm2"
    subprocess.run([str(tool("llama-gguf-split")), "--split", "--split-max-tensors", "70", str(default_model_path()),
                    str(out)], check=True, capture_output=True)
    first = sorted(out.parent.glob("smollm2-00001-of-*.gguf"))
    assert len(first) == 1 and len(list(out.parent.glob("smollm2-*.gguf"))) == 4
    return first[0]


def test_every_shard_of_a_split_gguf_is_placed(shards):
    with RpcDevice(1100) as peer, RpcDevice(1100) as ours:
        theirs = llama_server(shards, [peer])
        card, log = glmserve(shards, [ours])
        assert not ours.refused()
        assert abs(card["n_gpu_layers"] - theirs) <= 1, log
        assert 0.8 * peer.peak() <= ours.peak() <= 1.25 * peer.peak()


@pytest.mark.parametrize("mib", [4608, 4096])
def test_glm_4_7_flash_at_64k_holds_what_llama_server_holds_on_a_small_gpu(flash_gguf, mib):
    """The README's context on a 4.5 GiB device (every layer fits) and a 4 GiB one (some stay on
    the host): the KV cache (65,536 cells, 3.3 GiB) goes on the device with the layers, unified as
    llama-server's -c 65536 (split, 8 x 65,536 cells, would not fit it); the layers placed are
    llama-server's --fit's within one, and the device holds at least 95% of what it puts there."""
    with RpcDevice(mib) as peer, RpcDevice(mib) as ours:
        theirs = llama_server(flash_gguf, [peer], n_ctx=65536)
        card, log = glmserve(flash_gguf, [ours], "--max-num-seqs", "8", n_ctx=65536)
        assert abs(card["n_gpu_layers"] - theirs) <= 1, log
        assert not ours.refused(), log
        assert "unified" in log and card["max_model_len"] == 65536
        # at least 95% of what llama-server's fit puts there, and the margin (--fit-target, 1 GiB) kept
        assert 0.95 * peer.peak() <= ours.peak() <= (ours.mib - 1024) * MIB, (ours.peak() >> 20, peer.peak() >> 20, log)


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory) -> Path:
    """A GLM-4.5-shaped mixture of experts (``Glm4MoeForCausalLM``: 9 layers, the first dense, 16
    experts of 512 over a hidden size of 256, f16): 105 MiB, of which the experts are 96 MiB."""
    pytest.importorskip("torch")
    import sys

    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm4

    root = tmp_path_factory.mktemp("moe")
    folder = tiny_glm4(root / "moe", "Glm4MoeForCausalLM", "glm-4.7.jinja", context=4096, layers=9, hidden_size=256,
                       intermediate_size=512, moe_intermediate_size=512, n_routed_experts=16)
    return converted_gguf(folder, root / "moe.gguf", Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py",
                          tokenizer_pre="glm4", outtype="f16")


# llama-server's fit, a device's last line: "- RPC0 (127.0.0.1:N): 10 layers ( 6 overflowing), ..."
_THEIRS = re.compile(r"common_params_fit_impl: +- (RPC\d+) \(.*?\): +(\d+) layers \( *(\d+) overflowing\)")
# glmserve's plan: "RPC0: 10 layers (6 with experts in host memory), weights ..."
_OURS = re.compile(r"^(RPC\d+): (\d+) layers(?: \((\d+) with experts in host memory\))?,", re.M)


@pytest.mark.parametrize("mibs", [(1100,), (1060, 1080)], ids=["one-device", "two-devices"])
def test_a_mixture_of_experts_keeps_experts_in_host_memory_before_whole_layers(moe_gguf, mibs):
    """Where the experts do not all fit, every layer still goes to the devices, some with their
    experts in host memory, as llama-server's --fit places them: the layers and the partial
    layers on each device within one of its, and what each device holds within 0.8-1.25x."""
    with ExitStack() as stack:
        peers = [stack.enter_context(RpcDevice(mib)) for mib in mibs]
        ours = [stack.enter_context(RpcDevice(mib)) for mib in mibs]
        theirs = {name: (int(n), int(part)) for name, n, part in _THEIRS.findall(llama_server_log(moe_gguf, peers))}
        card, log = glmserve(moe_gguf, ours)
        placed = {name: (int(n), int(part or 0)) for name, n, part in _OURS.findall(log)}
        assert card["n_gpu_layers"] == 10 and sum(part for _, part in placed.values()) > 0, log
        assert len(theirs) == len(placed) == len(mibs), (theirs, log)
        for name, (n, part) in placed.items():
            assert abs(n - theirs[name][0]) <= 1 and abs(part - theirs[name][1]) <= 1, (theirs, log)
        for device, peer in zip(ours, peers):
            assert not device.refused() and 0.8 * peer.peak() <= device.peak() <= 1.25 * peer.peak(), log
            assert device.peak() <= (device.mib - 1024) * MIB
