"""``create_app``: the one place that builds the gateway and wires every dependency.

Tests pass in their own pieces (a registry, a policy store, tenants); nothing is a module-level
singleton. Resources with a lifetime (the client session, Redis, health checks, the policy file
watcher) are opened and closed in ``cleanup_ctx``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway import openapi, ops_routes, state
from gateway.access_log import AccessLog
from gateway.adapters.render import FragmentCache
from gateway.admission import Admission
from gateway.batch import service as batch
from gateway.cache.memory import MemoryCache
from gateway.cache.node import open_node_cache
from gateway.cache.redis import RedisCache
from gateway.cache.tiered import TieredCache
from gateway.cache.tracefile import open_recorder
from gateway.handlers import oip, openai, ops
from gateway.handlers.common import rate_limit_headers
from gateway.hot import HotAnswers
from gateway.metrics import GatewayMetrics
from gateway.middleware import make_error_middleware
from gateway.observe import MetricsObserver
from gateway.pipeline import Pipeline
from gateway.policy import fold
from gateway.policy.store import PolicyStore
from gateway.policy.targets import KnownModels
from gateway.quota.limiter import QuotaGate
from gateway.quota.shared import SharedLimiter
from gateway.quota.store import TenantStore
from gateway.routing.balancer import Router
from gateway.routing.health import HealthChecker
from gateway.settings import Settings
from gateway.tenants import Tenants
from gateway.upstream import AiohttpTransport, Upstream
from gateway.upstream.grpc import GrpcTransport
from gateway.upstream.transport import SchemeTransport

log = logging.getLogger("gateway")

_METRICS_FLUSH_S = 1.0
"""How often batched metric updates reach prometheus-client (and so other workers' scrapes)."""


def _policy_paths(spec: str | None) -> list[Path]:
    return [Path(spec)] if spec else []


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    tenants: Tenants | None = None,
    handle_signals: bool = False,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """Build the gateway application from settings.

    ``clock`` is the wall clock entries are aged by (tests pass their own).
    """
    settings.require_backends()
    metrics = GatewayMetrics(registry)
    observer = MetricsObserver(metrics, top_tenants=settings.quotas.top_tenants)
    logs = settings.logging
    # Per-request lines only at INFO and below, as before (errors are logged on their own).
    access_log = AccessLog(mode=logs.access_log if logs.level in ("DEBUG", "INFO") else "off",
                           sample=logs.access_log_sample, slow_ms=logs.slow_ms)
    app = web.Application(
        middlewares=[make_error_middleware(observer, access_log)],
        client_max_size=settings.max_body_bytes,
        handler_args={"max_field_size": 16384},
    )
    app[state.SETTINGS] = settings
    app[state.METRICS] = metrics
    app[state.OBSERVER] = observer
    app[state.ACCESS_LOG] = access_log
    tenant_store = TenantStore(
        Path(settings.tenants_file) if settings.tenants_file else None, tenants=tenants,
        poll_interval_s=settings.quotas.poll_interval_s,
        on_reload=lambda result: metrics.tenants_reloads.labels(result).inc())
    app[state.TENANTS] = tenant_store
    app[state.QUOTAS] = QuotaGate(
        settings.quotas, tenant_store, observer=observer,
        shared=SharedLimiter(settings.redis) if settings.redis.url else None)
    app.on_response_prepare.append(rate_limit_headers)
    policies = PolicyStore(
        _policy_paths(settings.policies.path), observer=observer,
        shadow_paths=_policy_paths(settings.policies.shadow_path) or None,
        poll_interval_s=settings.policies.poll_interval_s,
        models=KnownModels(names=settings.models, aliases=settings.model_aliases),
    )
    app[state.POLICIES] = policies
    router = Router(settings.backends, settings.routing, observer=observer)
    app[state.ROUTER] = router
    l1 = MemoryCache.from_settings(settings.cache, clock)
    l2 = RedisCache(settings.redis, observer=observer) if settings.redis.url else None
    node = open_node_cache(settings.cache.node, observer=observer, clock=clock)
    cache = TieredCache(l1, l2, node=node, observer=observer)
    app[state.CACHE] = cache
    app[state.FRAGMENTS] = FragmentCache()
    app.cleanup_ctx.append(_lifetime(handle_signals, clock))

    app.router.add_post("/v1/embeddings", openai.embeddings)
    app.router.add_post("/v1/classify", openai.classify)
    app.router.add_post("/v1/rank", openai.rank)
    app.router.add_post("/v2/models/{name}/infer", oip.infer)
    app.router.add_post("/v2/models/{name}/versions/{version}/infer", oip.infer)
    app.router.add_get("/v2/models/{name}", oip.model_metadata)
    app.router.add_get("/v2/models/{name}/versions/{version}", oip.model_metadata)
    app.router.add_get("/v2/health/ready", oip.server_ready)
    app.router.add_get("/v2/health/live", oip.server_live)
    app.router.add_get("/healthz", ops.healthz)
    app.router.add_get("/readyz", ops.readyz)
    app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/openapi.json", openapi.handler(openapi.load()))
    ops_routes.register(app)
    batch.register(app)  # after _lifetime: its worker needs the pipeline
    return app


def _lifetime(handle_signals: bool, clock: Callable[[], float]) -> Callable[
        [web.Application], AsyncIterator[None]]:
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        settings = app[state.SETTINGS]
        router = app[state.ROUTER]
        http = AiohttpTransport.create(pool_size=settings.routing.pool_size,
                                       connect_timeout_s=settings.routing.connect_timeout_s)
        grpc = GrpcTransport(connect_timeout_s=settings.routing.connect_timeout_s)
        # Each backend by its URL's scheme: http(s):// over the session, grpc:// over gRPC.
        transport = SchemeTransport({"http": http, "https": http, "grpc": grpc})
        policies = app[state.POLICIES]
        # The PII fold tables, built off the loop before traffic (else the first non-ASCII
        # request pays for them).
        await asyncio.get_running_loop().run_in_executor(None, fold.prepare)
        await policies.reload()
        await policies.start()
        tenants = app[state.TENANTS]
        await tenants.start()
        admission = Admission(settings.admission, observer=app[state.OBSERVER],
                              share=app[state.TENANTS].share)
        app[state.ADMISSION] = admission
        upstream = Upstream(transport, router, admission, settings.routing,
                            observer=app[state.OBSERVER])
        app[state.UPSTREAM] = upstream
        health = HealthChecker(router, transport, settings.routing,
                               models=settings.models)
        await health.start()
        app[state.ACCESS_LOG].start()
        app[state.METRICS].tally.start(_METRICS_FLUSH_S)
        pipeline = Pipeline(policies=policies, cache=app[state.CACHE], upstream=upstream,
                            model_version=router.model_version, observer=app[state.OBSERVER],
                            clock=clock, log_request_text=settings.logging.request_text)
        app[state.PIPELINE] = pipeline
        app[state.HOT] = HotAnswers(policies=policies, l1=app[state.CACHE].l1,
                                    model_version=router.model_version,
                                    observer=app[state.OBSERVER], clock=clock,
                                    enabled=not settings.logging.request_text,
                                    node=app[state.CACHE].node)
        loop = asyncio.get_running_loop()
        recorder = open_recorder(settings.cache.trace, clock)
        app[state.CACHE].recorder = app[state.HOT].recorder = recorder
        if handle_signals:
            loop.add_signal_handler(signal.SIGHUP,
                                    lambda: pipeline.background.spawn(_reload(policies, tenants)))
        try:
            yield
        finally:
            if handle_signals:
                loop.remove_signal_handler(signal.SIGHUP)
            await health.stop()
            await policies.stop()
            await tenants.stop()
            await pipeline.drain()
            await app[state.CACHE].close()
            if recorder is not None:
                await loop.run_in_executor(None, recorder.close)
            await app[state.QUOTAS].close()
            await transport.close()
            await app[state.METRICS].tally.stop()
            await app[state.ACCESS_LOG].stop()

    return lifetime


async def _reload(policies: PolicyStore, tenants: TenantStore) -> None:
    try:
        await policies.reload()
        log.info("policy reloaded on SIGHUP", extra={"policy_version": policies.active.version})
    except Exception:  # the store already logged the errors and kept the last good policy
        pass
    try:
        await tenants.reload()
    except Exception:  # likewise: logged, counted, the last good tenants stay
        return
