"""Cold-start figures per model: load, warm-up, first answer, and early answers vs later ones.

Per model and process: how long loading took (tokenizer and ONNX Runtime session:
``backend_model_load_duration_seconds``, a histogram after Triton's
``nv_model_load_duration_secs``, and ``backend_model_loads_total``), how long the warm-up
inferences took, the time from process start to the first answered request, and the latency
of the first ``FIRST`` answers after ready against the ``NEXT`` that follow (the
``backend_model_answer_seconds{window}`` histogram, and percentiles in ``GET /coldstart``).
Past ``FIRST + NEXT`` answers nothing more is kept: the steady state is what the other
latency metrics show.

The latency of an answer is its time in the batcher (queue + compute), what the backend
reports per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from backend.metrics import BackendMetrics

FIRST = 100
NEXT = 1_000
WINDOWS = ("first_100", "next_1000")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class ColdStart:
    """One model's cold-start figures; every method is cheap and runs on the event loop."""

    def __init__(self, model: str, metrics: BackendMetrics, *, started_at: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started_at = started_at
        self._metrics = metrics
        self._model = model
        self._windows = [metrics.answer_seconds.labels(model, w) for w in WINDOWS]
        self.load_s: float | None = None
        self.warmup_s: float | None = None
        self.ready_after_s: float | None = None
        self.first_answer_after_s: float | None = None
        self.answers = 0
        self._latencies: tuple[list[float], list[float]] = ([], [])

    def loaded(self, seconds: float) -> None:
        """The model was (re)loaded in ``seconds``."""
        self.load_s = seconds
        self._metrics.load_duration.labels(self._model).observe(seconds)
        self._metrics.loads.labels(self._model).inc()

    def warmed(self, seconds: float) -> None:
        """Warm-up took ``seconds``; the model is ready now."""
        self.warmup_s = seconds
        self.ready_after_s = self._clock() - self._started_at
        self._metrics.warmup_seconds.labels(self._model).set(seconds)

    def answered(self, seconds: float) -> None:
        """A request was answered after ``seconds`` in the batcher."""
        self.answers += 1
        if self.answers == 1:
            self.first_answer_after_s = self._clock() - self._started_at
            self._metrics.first_answer_seconds.labels(self._model).set(
                self.first_answer_after_s)
        if self.answers <= FIRST:
            window = 0
        elif self.answers <= FIRST + NEXT:
            window = 1
        else:
            return
        self._windows[window].observe(seconds)
        self._latencies[window].append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """The figures as JSON (milliseconds; None where not known yet)."""
        windows = {}
        for name, values in zip(WINDOWS, self._latencies, strict=True):
            windows[name] = {"answers": len(values),
                             "p50_ms": _ms(_percentile(values, 0.50)),
                             "p99_ms": _ms(_percentile(values, 0.99))}
        return {
            "load_ms": _ms(self.load_s),
            "warmup_ms": _ms(self.warmup_s),
            "ready_after_start_ms": _ms(self.ready_after_s),
            "first_answer_after_start_ms": _ms(self.first_answer_after_s),
            "answers_after_ready": self.answers,
            "windows": windows,
        }
