"""Typed application state keys: everything ``create_app`` wires, looked up by handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from gateway.access_log import AccessLog
    from gateway.adapters.render import FragmentCache
    from gateway.admission import Admission
    from gateway.batch.service import BatchService
    from gateway.cache.tiered import TieredCache
    from gateway.hot import HotAnswers
    from gateway.metrics import GatewayMetrics
    from gateway.observe import MetricsObserver
    from gateway.pipeline import Pipeline
    from gateway.policy.store import PolicyStore
    from gateway.quota.limiter import QuotaGate
    from gateway.quota.store import TenantStore
    from gateway.routing.balancer import Router
    from gateway.settings import Settings
    from gateway.stats import Stats
    from gateway.telemetry.sampler import History
    from gateway.upstream import Upstream

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
STATS: web.AppKey[Stats] = web.AppKey("stats")
HISTORY: web.AppKey[History] = web.AppKey("history")
"""The host's last 15 minutes, one point a second (gateway/telemetry/sampler.py)."""
FRAGMENTS: web.AppKey[FragmentCache] = web.AppKey("fragments")
ADMISSION: web.AppKey[Admission] = web.AppKey("admission")
BATCH: web.AppKey[BatchService] = web.AppKey("batch")
"""Only with a Redis for batches (gateway/batch/service.py); the batch routes answer 503 without."""
