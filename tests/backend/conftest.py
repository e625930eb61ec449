"""The MiniLM model loaded once (ONNX Runtime on the CPU) for every backend test that serves it."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.model import EmbeddingModel, load_models
from backend.settings import ServeSettings


@pytest.fixture(scope="session")
def models(models_dir: Path) -> list[EmbeddingModel]:
    return load_models(ServeSettings(models_dir=models_dir, device="cpu"))
