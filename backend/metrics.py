"""Prometheus metrics for the backend, on a registry the app is given (never the global one).

Names follow Prometheus conventions (base units, ``_seconds``, ``_total``). Queue and compute
time are split so that dashboards (and the gateway) can tell queueing delay from model compute.
"""

from __future__ import annotations

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
        self.ready = Gauge(
            "backend_model_ready", "1 once the model is warmed up and serving.", ["model"],
            registry=reg,
        )
        self.model_info = Gauge(
            "backend_model_info", "The model version, graph variant and execution provider.",
            ["model", "version", "variant", "provider"], registry=reg,
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
        self._compute = metrics.compute_seconds.labels(model)
        self._batch = metrics.batch_size.labels(model)

    def batch_computed(self, size: int, compute_s: float) -> None:
        self._batch.observe(size)
        self._compute.observe(compute_s)
