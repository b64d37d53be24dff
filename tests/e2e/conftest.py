"""Model folders for the ``transformers`` engine tests, built once per session (the converted
SmolLM2 folder is kept in pytest's cache between sessions), a GGUF shaped as GLM-4.7-Flash, and
the coding agents' homes."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_hf(request) -> Path:
    """The bundled SmolLM2 GGUF as a Hugging Face model folder (float32)."""
    pytest.importorskip("torch")
    from tests.hf_models import smollm2_folder

    return smollm2_folder(Path(request.config.cache.mkdir("smollm2-135m-instruct-hf")))


@pytest.fixture(scope="session")
def gguf_adapter(smollm2_hf, tmp_path_factory) -> Path:
    """A GGUF LoRA adapter for the bundled model (llama_cpp's ``--lora``) that changes its output."""
    pytest.importorskip("peft")
    from tests.hf_models import gguf_lora, lora_adapter

    root = tmp_path_factory.mktemp("gguf-lora")
    adapter = lora_adapter(smollm2_hf, root / "adapter", scale=0.05, target_modules=("v_proj", "o_proj"))
    return gguf_lora(adapter, root / "tuned.gguf")


@pytest.fixture(scope="session")
def flash_gguf(tmp_path_factory) -> Path:
    """A GGUF shaped as GLM-4.7-Flash (47 layers, 576-wide latent KV cache, 202,752 training
    positions; tiny hidden sizes, so the weights are 12 MB), its served name ``flash``."""
    pytest.importorskip("torch")
    import sys

    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm4

    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    assert converter.is_file(), f"{converter} is missing: run `make install` (it extracts llama.cpp's converter)"
    root = tmp_path_factory.mktemp("flash")
    folder = tiny_glm4(root / "flash", "Glm4MoeLiteForCausalLM", "glm-4.7.jinja", context=202752, layers=47)
    return converted_gguf(folder, root / "flash.gguf", converter, tokenizer_pre="glm4", outtype="f16")


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL cluster of the tests' own (``tests/postgres.py``), shared by the session:
    each test's objects have their own ids."""
    from tests.postgres import PostgresServer

    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def state_backend(request) -> tuple[str, dict[str, str]]:
    """``(name, environment)``: where the servers of a module keep their state, the default
    SQLite file in a fresh ``--state-dir``, then a PostgreSQL database (``--database-url``)."""
    import tempfile

    if request.param == "postgresql":
        return request.param, {"GLMSERVE_DATABASE_URL": request.getfixturevalue("postgres").url}
    return request.param, {"GLMSERVE_STATE_DIR": tempfile.mkdtemp(prefix="glmserve-state-")}


@pytest.fixture
def agent_home(request):
    """A coding agent's home at the same path on every run (``tests/model_cache.fixed_home``,
    named after the test module): its prompt, which names its working directory, is then the
    same on a day's later runs, and so is the tool caller trained on it."""
    from tests.model_cache import fixed_home

    with fixed_home(request.module.__name__.rpartition(".")[2].removeprefix("test_") + "-home") as home:
        yield home


@pytest.fixture(scope="session")
def claude(request) -> Path:
    """The ``claude`` command (Claude Code, ``agents.CLAUDE_CODE``), installed from the npm
    registry into pytest's cache once."""
    from tests.e2e.agents import CLAUDE_CODE
    from tests.e2e.npm_tools import npm_command

    return npm_command(request, CLAUDE_CODE, "claude", "claude-code")


@pytest.fixture(scope="session")
def codex(request) -> Path:
    """The ``codex`` command (``agents.CODEX``), installed from the npm registry into pytest's
    cache once."""
    from tests.e2e.agents import CODEX
    from tests.e2e.npm_tools import npm_command

    return npm_command(request, CODEX, "codex", "codex")


@pytest.fixture(scope="session")
def opencode(request) -> Path:
    """The ``opencode`` command (``agents.OPENCODE``), installed from the npm registry into
    pytest's cache once."""
    from tests.e2e.agents import OPENCODE
    from tests.e2e.npm_tools import npm_command

    return npm_command(request, OPENCODE, "opencode", "opencode")
