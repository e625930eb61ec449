"""bench/providers.py measures every provider it is given on the same ids, in one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.model import EmbeddingModel, load_models
from backend.settings import ServeSettings
from bench import providers


@pytest.mark.model
def test_measure_gives_a_row_per_provider_and_length(
        models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "QUICK_BATCHES", (1, 2))
    monkeypatch.setattr(providers, "LONG", "many words in a longer text " * 4)
    (model,) = load_models(ServeSettings(models_dir=models_dir, device="cpu", threads=1))
    assert isinstance(model, EmbeddingModel)
    rows = providers.measure({"CPUExecutionProvider": model}, quick=True)
    assert [(r.provider, r.texts) for r in rows] == [("CPU", "short"), ("CPU", "long")]
    assert rows[1].tokens > rows[0].tokens
    for row in rows:
        assert row.p50_ms > 0 and row.texts_per_s > 0 and row.best_batch in (1, 2)
        assert row.other_cores >= 0
    table = providers.render(rows, 1)
    assert "| CPU | short |" in table and "other processes' CPU" in table
