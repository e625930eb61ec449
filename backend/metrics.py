"""Prometheus metrics for the backend, on a registry the app is given (never the global one).

Names follow Prometheus conventions (base units, ``_seconds``, ``_total``). Queue and compute
time are split so that dashboards (and the gateway) can tell queueing delay from model compute.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Model loads take from a fraction of a second (a small graph from the page cache) to minutes
# (TensorRT building engines).
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class BackendMetrics:
    """Every metric the backend exports, as attributes; one instance per app."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        # status: the HTTP status, or for gRPC the one its error carries over REST (OK = 200),
        # so that one error-rate query covers both protocols; protocol: "rest" or "grpc".
        self.requests = Counter(
            "backend_requests_total",
            "Inference requests answered, by model, HTTP(-equivalent) status and protocol.",
            ["model", "status", "protocol"], registry=reg,
        )
        self.queue_seconds = Histogram(
            "backend_queue_seconds",
            "Per request: time in the batcher not spent computing its batches.",
            ["model"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.compute_seconds = Histogram(
            "backend_compute_seconds", "Per batch: ONNX Runtime compute time.",
            ["model"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.batch_size = Histogram(
            "backend_batch_size", "Items per ONNX Runtime call.", ["model"],
            buckets=BATCH_BUCKETS, registry=reg,
        )
        self.grpc_malformed = Counter(
            "backend_grpc_malformed_total",
            "gRPC calls refused with INVALID_ARGUMENT because the request message did not "
            "parse as protobuf, by method.", ["method"], registry=reg,
        )
        # Read from each batcher at scrape time (``DataPlane``): nothing to update per request.
        self.queue_depth = Gauge(
            "backend_queue_depth", "Items waiting to be batched.", ["model"], registry=reg,
        )
        # Per priority (Triton's pending request count, queue duration and REJECTED as the guide).
        self.pending = Gauge(
            "backend_pending_requests", "Items waiting to be batched, by priority level.",
            ["model", "priority"], registry=reg,
        )
        self.queue_duration = Histogram(
            "backend_queue_duration_seconds",
            "Per request answered: time queued (not computing), by priority level.",
            ["model", "priority"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        # reason: expired (deadline passed while queued), late (could not finish in time when
        # its turn came); both dropped before compute and answered 504 at once.
        self.dropped = Counter(
            "backend_requests_dropped_total",
            "Requests dropped before compute, by priority level and reason.",
            ["model", "priority", "reason"], registry=reg,
        )
        # reason: queue_full, deadline (the work ahead outlasts it); both 503 at once.
        self.rejected = Counter(
            "backend_requests_rejected_total",
            "Requests refused on arrival, by priority level and reason.",
            ["model", "priority", "reason"], registry=reg,
        )
        self.express = Counter(
            "backend_express_batches_total",
            "Batches the express lane computed beside a regular batch (BACKEND_EXPRESS_LANE).",
            ["model"], registry=reg,
        )
        self.express_items = Counter(
            "backend_express_items_total", "Items computed in the express lane's batches.",
            ["model"], registry=reg,
        )
        self.ready = Gauge(
            "backend_model_ready", "1 once the model is warmed up and serving.", ["model"],
            registry=reg,
        )
        self.model_info = Gauge(
            "backend_model_info", "The model version, graph variant and execution provider.",
            ["model", "version", "variant", "provider"], registry=reg,
        )

        # Cold starts (coldstart.py). Triton's nv_model_load_duration_secs is the guide for the
        # load histogram; the count of (re)loads is its _count, and loads_total says it plainly.
        self.load_duration = Histogram(
            "backend_model_load_duration_seconds",
            "Model load time: tokenizer and ONNX Runtime session (graph optimisation included).",
            ["model"], buckets=LOAD_BUCKETS, registry=reg,
        )
        self.loads = Counter(
            "backend_model_loads_total", "Model loads (and reloads) by this process.",
            ["model"], registry=reg,
        )
        self.warmup_seconds = Gauge(
            "backend_model_warmup_seconds", "Duration of the last warm-up before ready.",
            ["model"], registry=reg,
        )
        self.first_answer_seconds = Gauge(
            "backend_model_first_answer_seconds",
            "Time from process start to the model's first answered request.",
            ["model"], registry=reg,
        )
        self.answer_seconds = Histogram(
            "backend_model_answer_seconds",
            "Queue + compute per answer, for the first 100 answers after ready "
            "(window=first_100) and the 1,000 after them (window=next_1000).",
            ["model", "window"], buckets=LATENCY_BUCKETS, registry=reg,
        )

    def observer(self, model: str) -> ModelBatchObserver:
        """The batcher hooks for ``model``."""
        return ModelBatchObserver(self, model)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelBatchObserver:
    """Feeds one model's batcher events into the metrics (implements ``BatchObserver``)."""

    def __init__(self, metrics: BackendMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model
        self._compute = metrics.compute_seconds.labels(model)
        self._batch = metrics.batch_size.labels(model)
        self._waits: dict[int, Any] = {}

    def batch_computed(self, size: int, compute_s: float) -> None:
        self._batch.observe(size)
        self._compute.observe(compute_s)

    def waited(self, level: int, seconds: float) -> None:
        child = self._waits.get(level)
        if child is None:  # labels() once per level: this runs per request
            child = self._waits[level] = self._metrics.queue_duration.labels(
                self._model, str(level + 1))
        child.observe(seconds)

    def dropped(self, level: int, reason: str) -> None:
        self._metrics.dropped.labels(self._model, str(level + 1), reason).inc()

    def rejected(self, level: int, reason: str) -> None:
        self._metrics.rejected.labels(self._model, str(level + 1), reason).inc()

    def express_batch(self, size: int) -> None:
        self._metrics.express.labels(self._model).inc()
        self._metrics.express_items.labels(self._model).inc(size)
