"""``create_app``: the one place that builds the backend and wires every dependency.

Routes (Open Inference Protocol v2 REST, plus OpenAI-compatible embeddings and metrics)::

    GET  /v2                                            server metadata
    GET  /v2/health/live | /v2/health/ready             liveness | readiness (503 until warm)
    GET  /v2/models/{model}[/versions/{version}]        model metadata
    GET  /v2/models/{model}[/versions/{version}]/ready  model readiness
    POST /v2/models/{model}[/versions/{version}]/infer  inference
    POST /v1/embeddings                                 OpenAI-compatible embeddings
    GET  /metrics                                       Prometheus text format
    GET  /coldstart                                     cold-start figures per model (JSON)
    GET  /openapi.json                                  this API as an OpenAPI 3.1 document

The same data plane also serves the Open Inference Protocol over gRPC on ``grpc_port``, in this
event loop (``backend/rpc``): started after the data plane, stopped before it.

Models are loaded during startup (so a bad repository or ``--device cuda`` without a GPU stops
the server before it listens) unless the caller passes them in; warm-up then runs in the
background while the server is live but not ready. GPU metrics (``backend/gpu.py``) are
sampled in the background once the models are loaded, for the GPUs they run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from backend import handlers, openapi
from backend.dataplane import DataPlane
from backend.gpu import GpuCollector, GpuMonitor, nvml_devices, sample_every
from backend.handlers import DATAPLANE, GPU_METRICS, METRICS
from backend.metrics import BackendMetrics
from backend.middleware import errors, request_context
from backend.model import EmbeddingModel, load_models
from backend.rpc.server import grpc_server
from backend.server import MAX_FIELD_SIZE, MAX_LINE_SIZE
from backend.settings import ServeSettings
from oip.openapi import handler as serve_document

SETTINGS = web.AppKey("settings", ServeSettings)

log = logging.getLogger("backend.app")


def create_app(
    settings: ServeSettings,
    *,
    models: Sequence[EmbeddingModel] | None = None,
    registry: CollectorRegistry | None = None,
    nvml: Any = None,
    started_at: float | None = None,
) -> web.Application:
    """The backend application.

    ``models``: already-loaded models to serve (tests share one ONNX Runtime session between
    apps this way); by default they are loaded from ``settings.models_dir`` at startup.
    ``registry``: where metrics are registered (default: a fresh one for this app).
    ``nvml``: the NVML binding for GPU metrics (default: ``pynvml`` where installed; tests pass
    a double). ``started_at``: ``time.monotonic()`` at process start (default: now), from which
    the cold-start figures count.
    """
    metrics = BackendMetrics(registry)
    app = web.Application(
        client_max_size=settings.client_max_size,
        middlewares=[request_context(metrics=metrics, log_requests=settings.access_log), errors],
        handler_args={"max_line_size": MAX_LINE_SIZE, "max_field_size": MAX_FIELD_SIZE},
    )
    app[SETTINGS] = settings
    app[METRICS] = metrics
    started = time.monotonic() if started_at is None else started_at
    app.cleanup_ctx.append(_data_plane(settings, metrics, models, started))
    if settings.gpu_metrics_interval_s > 0:
        app.cleanup_ctx.append(_gpu_metrics(settings, metrics, nvml))
    if settings.grpc_listen_port:
        app.cleanup_ctx.append(_grpc(settings, metrics))
    _add_routes(app)
    return app


def _data_plane(
    settings: ServeSettings, metrics: BackendMetrics, models: Sequence[EmbeddingModel] | None,
    started_at: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        loaded = models
        if loaded is None:
            loaded = await asyncio.get_running_loop().run_in_executor(None, load_models, settings)
        plane = DataPlane(loaded, settings, metrics, started_at=started_at)
        app[DATAPLANE] = plane
        await plane.start()
        log.info("serving", extra={"fields": {
            "host": settings.host, "port": settings.port, "region": settings.region,
            "zone": settings.zone, "models": sorted(plane.models)}})
        try:
            yield
        finally:
            await plane.close()

    return context


def _gpu_metrics(settings: ServeSettings, metrics: BackendMetrics, nvml: Any
                 ) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        plane = app[DATAPLANE]
        # Every GPU session runs on CUDA device 0 (runtime.py): that is the one to watch.
        cuda_ids = [0 for s in plane.models.values() if s.model.runtime.device == "cuda"]
        loop = asyncio.get_running_loop()
        monitor, reason = await loop.run_in_executor(
            None, GpuMonitor.open, nvml_devices(cuda_ids), nvml)
        if monitor is None:
            log.info("GPU metrics off", extra={"fields": {"reason": reason}})
            app[GPU_METRICS] = f"off: {reason}"
            yield
            return
        collector = GpuCollector()
        metrics.registry.register(collector)
        app[GPU_METRICS] = f"on: GPU {', '.join(monitor.gpus)}"
        log.info("GPU metrics on", extra={"fields": {
            "gpus": monitor.gpus, "interval_s": settings.gpu_metrics_interval_s}})

        def failed(exc: Exception, first: bool) -> None:
            if first:  # once per run of failures: a broken driver must not flood the log
                log.warning("GPU sample failed; GPU metrics absent until one succeeds",
                            extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})

        task = loop.create_task(sample_every(
            monitor, collector, settings.gpu_metrics_interval_s, failed))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            metrics.registry.unregister(collector)
            await loop.run_in_executor(None, monitor.close)

    return context


def _grpc(settings: ServeSettings, metrics: BackendMetrics
          ) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        async with grpc_server(app[DATAPLANE], metrics, settings):
            yield

    return context


def _add_routes(app: web.Application) -> None:
    app.router.add_get("/v2", handlers.server_metadata)
    app.router.add_get("/v2/", handlers.server_metadata)
    app.router.add_get("/v2/health/live", handlers.live)
    app.router.add_get("/v2/health/ready", handlers.ready)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.router.add_get(prefix, handlers.model_metadata)
        app.router.add_get(prefix + "/ready", handlers.model_ready)
        app.router.add_post(prefix + "/infer", handlers.infer)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_get("/coldstart", handlers.cold_starts)
    app.router.add_get("/openapi.json", serve_document(openapi.load()))
