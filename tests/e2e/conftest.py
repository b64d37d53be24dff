"""Model folders for the ``transformers`` engine tests, built once per session (the converted
SmolLM2 folder is kept in pytest's cache between sessions)."""

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
def browser():
    """Headless Chromium for the web page's tests (``tests/e2e/browser.py``)."""
    pytest.importorskip("playwright")
    from tests.e2e.browser import launch

    yield from launch()
