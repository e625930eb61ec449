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

from gateway.adapters.registry import CACHED_PATHS
from gateway.adapters.render import FragmentCache
from gateway.cache.deployment import deployment_of
from gateway.cache.memory import MemoryCache
from gateway.cache.node import open_node_cache
from gateway.cache.redis import RedisCache
from gateway.cache.tiered import TieredCache
from gateway.cache.tracefile import open_recorder
from gateway.http import app_state as state
from gateway.http import batch_jobs as batch
from gateway.http.middleware import make_error_middleware
from gateway.http.routes import cached, oip, openapi, ops, probes
from gateway.pipeline import Pipeline
from gateway.pipeline.hot_answers import HotAnswers
from gateway.policy import fold
from gateway.policy.share import PolicyShare
from gateway.policy.store import PolicyStore
from gateway.policy.targets import KnownModels
from gateway.routing.balancer import Router
from gateway.settings import Settings
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.tenants.directory import Tenants
from gateway.tenants.quota.limiter import QuotaGate
from gateway.tenants.quota.shared import SharedLimiter
from gateway.tenants.store import TenantStore
from gateway.upstream import AiohttpTransport, Upstream
from gateway.upstream.admission.control import Admission
from gateway.upstream.grpc import GrpcTransport
from gateway.upstream.health import HealthChecker
from gateway.upstream.lean import LeanTransport
from gateway.upstream.schedule import Schedule
from gateway.upstream.transport import SchemeTransport, Transport
from oip.openapi import handler as serve_document

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
    policy_share: Path | None = None,
) -> web.Application:
    """Build the gateway application from settings.

    ``clock`` is the wall clock entries are aged by (tests pass their own). ``policy_share``:
    the folder through which the workers of one gateway share their policy reads
    (``server.supervise`` makes it), so they serve one version.
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
    policies = PolicyStore(
        _policy_paths(settings.policies.path), observer=observer,
        shadow_paths=_policy_paths(settings.policies.shadow_path) or None,
        poll_interval_s=settings.policies.poll_interval_s,
        models=KnownModels(routes=CACHED_PATHS, names=settings.models,
                           aliases=settings.model_aliases),
        share=PolicyShare(policy_share) if policy_share is not None else None,
    )
    app[state.POLICIES] = policies
    router = Router(settings.backends, settings.routing, observer=observer)
    app[state.ROUTER] = router
    l1 = MemoryCache.from_settings(settings.cache, clock)
    l2 = RedisCache(settings.redis, observer=observer) if settings.redis.url else None
    # Scoped to this deployment and each model's graph: another gateway sharing the directory
    # never answers from these entries (gateway/cache/deployment.py).
    tenants_now = tenant_store.current
    deployment = deployment_of(settings.cache.node, keys=tenants_now.keys,
                               configured=tenants_now.configured)
    node = open_node_cache(settings.cache.node, deployment=deployment,
                           model_identity=router.model_identity, observer=observer, clock=clock)
    cache = TieredCache(l1, l2, node=node, observer=observer)
    app[state.CACHE] = cache
    app[state.FRAGMENTS] = FragmentCache()
    lifetimes = [_telemetry, _stores, _transport, _policies, _tenants, _health, _pipeline(clock),
                 _trace(clock)]
    app.cleanup_ctx.extend([*lifetimes, *([_sighup] if handle_signals else [])])

    cached.register(app)  # every route of the registry (gateway/adapters/registry.py)
    app.router.add_get("/v2/models/{name}", oip.model_metadata)
    app.router.add_get("/v2/models/{name}/versions/{version}", oip.model_metadata)
    app.router.add_get("/v2/health/ready", oip.server_ready)
    app.router.add_get("/v2/health/live", oip.server_live)
    app.router.add_get("/healthz", probes.healthz)
    app.router.add_get("/readyz", probes.readyz)
    app.router.add_get("/metrics", probes.metrics)
    app.router.add_get("/openapi.json", serve_document(
        openapi.served(openapi.load(), admin=bool(settings.admin_token))))
    ops.register(app)
    batch.register(app)  # after the pipeline's lifetime: its worker needs the pipeline
    return app


# Each long-lived resource has its own cleanup context, in the order they start: when one fails
# to start, aiohttp runs the exits of those already started (in reverse), so nothing leaks.
async def _telemetry(app: web.Application) -> AsyncIterator[None]:
    app[state.ACCESS_LOG].start()
    app[state.METRICS].tally.start(_METRICS_FLUSH_S)
    try:
        yield
    finally:
        await app[state.METRICS].tally.stop()
        await app[state.ACCESS_LOG].stop()


async def _stores(app: web.Application) -> AsyncIterator[None]:
    """The cache tiers and the quota gate were built with the app; they close last but one."""
    try:
        yield
    finally:
        await app[state.CACHE].close()
        await app[state.QUOTAS].close()


async def _transport(app: web.Application) -> AsyncIterator[None]:
    routing = app[state.SETTINGS].routing
    http = AiohttpTransport.create(pool_size=routing.pool_size,
                                   connect_timeout_s=routing.connect_timeout_s)
    grpc = GrpcTransport(connect_timeout_s=routing.connect_timeout_s)
    # Each backend by its URL's scheme: http(s):// over the session (http:// over the lean
    # client when ``routing.http_client`` says so), grpc:// over gRPC.
    plain: Transport = http
    if routing.http_client == "lean":
        plain = LeanTransport(pool_size=routing.pool_size,
                              connect_timeout_s=routing.connect_timeout_s)
    app[state.TRANSPORT] = SchemeTransport({"http": plain, "https": http, "grpc": grpc})
    try:
        yield
    finally:
        await app[state.TRANSPORT].close()


async def _policies(app: web.Application) -> AsyncIterator[None]:
    policies = app[state.POLICIES]
    # The PII fold tables, built off the loop before traffic (else the first non-ASCII request
    # pays for them).
    await asyncio.get_running_loop().run_in_executor(None, fold.prepare)
    await policies.reload()
    await policies.start()
    try:
        yield
    finally:
        await policies.stop()


async def _tenants(app: web.Application) -> AsyncIterator[None]:
    await app[state.TENANTS].start()
    try:
        yield
    finally:
        await app[state.TENANTS].stop()


async def _health(app: web.Application) -> AsyncIterator[None]:
    settings = app[state.SETTINGS]
    health = HealthChecker(app[state.ROUTER], app[state.TRANSPORT], settings.routing,
                           models=settings.models)
    await health.start()
    try:
        yield
    finally:
        await health.stop()


def _pipeline(clock: Callable[[], float]) -> Callable[[web.Application], AsyncIterator[None]]:
    async def pipeline_lifetime(app: web.Application) -> AsyncIterator[None]:
        settings, router = app[state.SETTINGS], app[state.ROUTER]
        policies, observer = app[state.POLICIES], app[state.OBSERVER]
        admission = Admission(settings.admission, observer=observer,
                              share=app[state.TENANTS].share)
        app[state.ADMISSION] = admission
        routing = settings.routing
        # What every backend call carries: priority, the tenant's fairness key (docs/SCHEDULING.md).
        schedule = Schedule(interactive=routing.backend_priority_interactive,
                            batch=routing.backend_priority_batch, salt=routing.fairness_salt,
                            tenant_priority=app[state.TENANTS].backend_priority)
        upstream = Upstream(app[state.TRANSPORT], router, admission, routing, observer=observer,
                            schedule=schedule)
        app[state.UPSTREAM] = upstream
        pipeline = Pipeline(policies=policies, cache=app[state.CACHE], upstream=upstream,
                            model_version=router.model_version, observer=observer,
                            clock=clock, log_request_text=settings.logging.request_text)
        app[state.PIPELINE] = pipeline
        app[state.HOT] = HotAnswers(policies=policies, l1=app[state.CACHE].l1,
                                    model_version=router.model_version, observer=observer,
                                    clock=clock, enabled=not settings.logging.request_text,
                                    node=app[state.CACHE].node)
        try:
            yield
        finally:
            await pipeline.drain()

    return pipeline_lifetime


def _trace(clock: Callable[[], float]) -> Callable[[web.Application], AsyncIterator[None]]:
    async def trace_lifetime(app: web.Application) -> AsyncIterator[None]:
        """The cache trace recorder (``cache.trace``, off by default): the tiers and the hot
        answers record into it; its file is closed off the loop."""
        recorder = open_recorder(app[state.SETTINGS].cache.trace, clock)
        app[state.CACHE].recorder = app[state.HOT].recorder = recorder
        try:
            yield
        finally:
            if recorder is not None:
                await asyncio.get_running_loop().run_in_executor(None, recorder.close)

    return trace_lifetime


async def _sighup(app: web.Application) -> AsyncIterator[None]:
    """SIGHUP reloads the policy and the tenants file (only when the app handles signals)."""
    policies, tenants, pipeline = app[state.POLICIES], app[state.TENANTS], app[state.PIPELINE]
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP,
                            lambda: pipeline.background.spawn(_reload(policies, tenants)))
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


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
