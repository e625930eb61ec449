"""Cold-start figures (backend/coldstart.py): per model load, warm-up, first answer, the first
100 answers after ready against the next 1,000, and the (re)load count, in /metrics and in
``GET /coldstart``; a restarted backend reports its own fresh figures."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from backend.coldstart import FIRST, NEXT, ColdStart
from backend.metrics import BackendMetrics
from tests.backend.serving import infer_body, metric, scrape, serving


def test_answers_fall_into_the_first_then_the_next_window_then_none() -> None:
    now = [100.0]
    metrics = BackendMetrics(CollectorRegistry())
    cold = ColdStart("m", metrics, started_at=90.0, clock=lambda: now[0])
    cold.loaded(1.5)
    cold.loaded(0.5)  # a reload
    now[0] = 104.0
    cold.warmed(2.0)
    now[0] = 105.0
    for i in range(FIRST + NEXT + 50):
        cold.answered(0.010 if i < FIRST else 0.001)
    text = metrics.render()[0].decode()
    assert metric(text, "backend_model_loads_total", model="m") == 2
    assert metric(text, "backend_model_load_duration_seconds_count", model="m") == 2
    assert metric(text, "backend_model_load_duration_seconds_sum", model="m") == 2.0
    assert metric(text, "backend_model_warmup_seconds", model="m") == 2.0
    assert metric(text, "backend_model_first_answer_seconds", model="m") == 15.0
    assert metric(text, "backend_model_answer_seconds_count", window="first_100") == FIRST
    assert metric(text, "backend_model_answer_seconds_count", window="next_1000") == NEXT
    snap = cold.snapshot()
    assert snap["load_ms"] == 500.0 and snap["warmup_ms"] == 2000.0
    assert snap["ready_after_start_ms"] == 14_000.0
    assert snap["first_answer_after_start_ms"] == 15_000.0
    assert snap["answers_after_ready"] == FIRST + NEXT + 50
    assert snap["windows"]["first_100"] == {"answers": FIRST, "p50_ms": 10.0, "p99_ms": 10.0}
    assert snap["windows"]["next_1000"] == {"answers": NEXT, "p50_ms": 1.0, "p99_ms": 1.0}


def test_nothing_known_before_the_events() -> None:
    snap = ColdStart("m", BackendMetrics(CollectorRegistry()), started_at=0.0).snapshot()
    assert snap["load_ms"] is None and snap["first_answer_after_start_ms"] is None
    assert snap["windows"]["first_100"] == {"answers": 0, "p50_ms": None, "p99_ms": None}


@pytest.mark.model
@pytest.mark.parametrize("start", ["first", "restart"])
async def test_a_started_backend_reports_its_cold_start(models_dir: Path, start: str) -> None:
    """Each start (the second is a restart: a new app loading the model again) loads the model
    from the repository, warms up, and reports its own figures from zero."""
    from backend.model import load_models
    from backend.settings import ServeSettings

    loaded = load_models(ServeSettings(models_dir=models_dir, device="cpu", threads=1))
    async with serving(loaded) as client:
        for n in range(3):
            response = await client.post("/v2/models/minilm/infer",
                                         json=infer_body([f"cold start {start} {n}"]))
            assert response.status == 200
        text = await (await client.get("/metrics")).text()
        figures = (await (await client.get("/coldstart")).json())["models"]["minilm"]
        assert await scrape(client, "backend_model_loads_total", model="minilm") == 1
    assert metric(text, "backend_model_load_duration_seconds_count", model="minilm") == 1
    assert metric(text, "backend_model_load_duration_seconds_sum", model="minilm") > 0
    assert metric(text, "backend_model_warmup_seconds", model="minilm") > 0
    assert metric(text, "backend_model_first_answer_seconds", model="minilm") > 0
    assert metric(text, "backend_model_answer_seconds_count", model="minilm",
                  window="first_100") == 3
    assert figures["answers_after_ready"] == 3
    assert figures["load_ms"] > 0 and figures["warmup_ms"] > 0
    # Ready comes after the warm-up, and the first answer after ready.
    assert figures["first_answer_after_start_ms"] >= figures["ready_after_start_ms"] > 0
    assert figures["windows"]["first_100"]["answers"] == 3
    assert figures["windows"]["next_1000"] == {"answers": 0, "p50_ms": None, "p99_ms": None}
