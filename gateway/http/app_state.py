"""Typed application state keys: everything ``create_app`` wires, looked up by handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from gateway.adapters.render import FragmentCache
    from gateway.cache.tiered import TieredCache
    from gateway.http.batch_jobs import BatchService
    from gateway.http.stats import Stats
    from gateway.pipeline import Pipeline
    from gateway.pipeline.hot_answers import HotAnswers
    from gateway.policy.store import PolicyStore
    from gateway.routing.balancer import Router
    from gateway.settings import Settings
    from gateway.telemetry.access_log import AccessLog
    from gateway.telemetry.metrics import GatewayMetrics
    from gateway.telemetry.prometheus import MetricsObserver
    from gateway.telemetry.sampler import History
    from gateway.tenants.quota.limiter import QuotaGate
    from gateway.tenants.store import TenantStore
    from gateway.upstream import Upstream
    from gateway.upstream.admission.control import Admission
    from gateway.upstream.transport import Transport

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
METRICS: web.AppKey[GatewayMetrics] = web.AppKey("metrics")
PIPELINE: web.AppKey[Pipeline] = web.AppKey("pipeline")
OBSERVER: web.AppKey[MetricsObserver] = web.AppKey("observer")
ACCESS_LOG: web.AppKey[AccessLog] = web.AppKey("access_log")
HOT: web.AppKey[HotAnswers] = web.AppKey("hot")
TENANTS: web.AppKey[TenantStore] = web.AppKey("tenants")
"""The tenants file, live: identify, each tenant's quota, weight and class (reloads)."""
QUOTAS: web.AppKey[QuotaGate] = web.AppKey("quotas")
POLICIES: web.AppKey[PolicyStore] = web.AppKey("policies")
CACHE: web.AppKey[TieredCache] = web.AppKey("cache")
ROUTER: web.AppKey[Router] = web.AppKey("router")
UPSTREAM: web.AppKey[Upstream] = web.AppKey("upstream")
TRANSPORT: web.AppKey[Transport] = web.AppKey("transport")
"""Every backend call's transport (REST and gRPC by URL scheme), shared by upstream and health."""
STATS: web.AppKey[Stats] = web.AppKey("stats")
HISTORY: web.AppKey[History] = web.AppKey("history")
"""The host's last 15 minutes, one point a second (gateway/telemetry/sampler.py)."""
FRAGMENTS: web.AppKey[FragmentCache] = web.AppKey("fragments")
ADMISSION: web.AppKey[Admission] = web.AppKey("admission")
BATCH: web.AppKey[BatchService] = web.AppKey("batch")
"""Only with a Redis for batches (gateway/http/batch_jobs.py); the batch routes answer 503
without."""
