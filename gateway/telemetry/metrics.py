"""Prometheus metrics for the gateway, built on a registry the app is given (never the global one).

Names follow Prometheus conventions (base units, ``_seconds``, ``_total``). With several worker
processes, ``PROMETHEUS_MULTIPROC_DIR`` is set by the supervisor and values are shared through
prometheus-client's multiprocess mode, so ``/metrics`` on any worker reports the whole gateway.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.telemetry.batched_counts import Tally

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _FlushFirst(Collector):
    """Collects nothing; hands the tally's pending updates over before the real collectors run,
    so a scrape (or a test reading the registry) sees every update made so far."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        self._tally.flush()
        return []


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class GatewayMetrics:
    """Every metric the gateway exports, as attributes; one instance per app."""

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, resolved once: on the hit path ``labels()`` (a lock and
        a dict walk per call) cost more than the cache lookup itself."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # In multiprocess mode values live in mmap files; objects must not be registered with the
        # collecting registry (the MultiProcessCollector reads the files instead).
        mp = multiprocess_enabled()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tally = Tally()
        """Batched updates (gateway/telemetry/batched_counts.py); flushed before every collection of
        the registry."""
        self.registry.register(_FlushFirst(self.tally))  # registered first: collected first
        reg = None if mp else self.registry
        if mp:
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]

        self.requests = Counter(
            "gateway_requests_total", "Requests answered, by route, status and cache result.",
            ["route", "status", "cache"], registry=reg,
        )
        self.request_duration = Histogram(
            "gateway_request_duration_seconds", "Time from request received to response ready.",
            ["route", "cache"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.cache_lookups = Counter(
            "gateway_cache_lookups_total",
            "Cache lookups per item, by tier (l1, node, l2) and result.",
            ["tier", "result"], registry=reg,
        )
        self.cache_items = Counter(
            "gateway_cache_items_total",
            "Items (texts) answered, by final cache result (hit, miss, stale, coalesced, bypass).",
            ["model", "tenant", "result"], registry=reg,
        )
        self.cache_stores = Counter(
            "gateway_cache_stores_total", "Entries written, by tier.", ["tier"], registry=reg,
        )
        self.cache_errors = Counter(
            "gateway_cache_errors_total", "Cache tier errors (e.g. Redis down), by tier.", ["tier"],
            registry=reg,
        )
        # The node tier is one store per host, so the latest reading of any worker is its size.
        self.cache_bytes = Gauge(
            "gateway_cache_bytes", "Bytes a cache tier holds (node: pages of both generations).",
            ["tier"], registry=reg, multiprocess_mode="mostrecent",
        )
        # Each worker's L1 chooses its own (gateway/cache/miniature.py): the longest is shown.
        self.cache_sketch_period = Gauge(
            "gateway_cache_sketch_period",
            "Lookups per entry between two halvings of a cache tier's frequency sketch (l1: "
            "the period its miniatures chose, 40 or 320).",
            ["tier"], registry=reg, multiprocess_mode="max",
        )
        self.cache_evictions = Counter(
            "gateway_cache_evictions_total",
            "Entries a cache tier dropped or kept out, by reason: capacity (to stay in its "
            "bound), expired, rejected (new entries its admission filter kept out).",
            ["tier", "reason"], registry=reg,
        )
        self.compute_saved = Counter(
            "gateway_compute_saved_seconds_total",
            "Backend compute time that cache hits avoided (compute time stored with the entry).",
            ["model"], registry=reg,
        )
        self.coalesced = Counter(
            "gateway_coalesced_total", "Items that joined an identical in-flight backend call.",
            registry=reg,
        )
        self.upstream_duration = Histogram(
            "gateway_upstream_duration_seconds", "Backend call duration, by backend and zone.",
            ["backend", "zone", "outcome"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.upstream_queue = Histogram(
            "gateway_upstream_queue_seconds", "Queue time the backend reported.", ["backend"],
            buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.upstream_compute = Histogram(
            "gateway_upstream_compute_seconds", "Compute time the backend reported.", ["backend"],
            buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.upstream_batch = Histogram(
            "gateway_upstream_batch_size", "Items per backend call.", buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.backend_requests = Counter(
            "gateway_backend_requests_total", "Backend calls, by backend, zone and outcome.",
            ["backend", "zone", "outcome"], registry=reg,
        )
        self.backend_healthy = Gauge(
            "gateway_backend_healthy", "1 when the backend is healthy and not ejected.",
            ["backend", "zone"], registry=reg, multiprocess_mode="liveall",
        )
        self.slow_start = Gauge(
            "gateway_backend_slow_start",
            "1 while the backend is in slow start (back, its share still ramping up).",
            ["backend", "zone"], registry=reg, multiprocess_mode="liveall",
        )
        # Cold starts (routing/coldstart.py): a backend's first answers after it became ready
        # apart from the rest, so a restart's slow start shows and the steady state stays clean.
        self.backend_answer = Histogram(
            "gateway_backend_answer_seconds",
            "Successful backend call duration by phase: cold (the first 100 answers after the "
            "backend became ready) or steady.",
            ["backend", "zone", "phase"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        # Every worker sees the same health changes: the max is the gateway's count.
        self.backend_readies = Gauge(
            "gateway_backend_readies",
            "Times the backend became ready (health checks passing after failing) since start.",
            ["backend", "zone"], registry=reg, multiprocess_mode="max",
        )
        self.ejections = Counter(
            "gateway_backend_ejections_total",
            "Outlier ejections, by backend and cause (consecutive_5xx, "
            "consecutive_gateway_failure, success_rate).",
            ["backend", "cause"], registry=reg,
        )
        self.retries = Counter(
            "gateway_upstream_retries_total",
            "Retries on another backend, by the failure retried (connect_failure, reset, "
            "per_try_timeout, http_<status>).",
            ["reason"], registry=reg,
        )
        self.retry_overflow = Counter(
            "gateway_upstream_retry_overflow_total",
            "Retries the retry budget refused, by the failure they would have retried.",
            ["reason"], registry=reg,
        )
        self.hedges = Counter(
            "gateway_upstream_hedges_total", "Hedged second requests sent.", registry=reg,
        )
        self.queue_depth = Gauge(
            "gateway_queue_depth",
            "Requests waiting for an upstream slot, by tier and priority class (interactive, "
            "batch).", ["tier", "class"], registry=reg, multiprocess_mode="livesum",
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time a backend call that queued waited for an upstream slot, by tier, priority "
            "class and outcome (granted; shed, expired, cancelled: left the queue).",
            ["tier", "class", "outcome"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.inflight = Gauge(
            "gateway_upstream_inflight", "Backend calls in flight, by tier.", ["tier"],
            registry=reg, multiprocess_mode="livesum",
        )
        self.concurrency_limit = Gauge(
            "gateway_concurrency_limit",
            "Backend calls allowed in flight per tier (tier_concurrency, or the adaptive limit).",
            ["tier"], registry=reg, multiprocess_mode="livesum",
        )
        self.min_rtt = Gauge(
            "gateway_adaptive_min_rtt_seconds",
            "The adaptive limit's ideal latency (minRTT) per tier; 0 before its first probe.",
            ["tier"], registry=reg, multiprocess_mode="livemax",
        )
        self.shed = Counter(
            "gateway_shed_total", "Requests shed with 503/504, by reason.", ["reason"],
            registry=reg,
        )
        # Per tenant: ``tenant`` is one of the busiest ``quotas.top_tenants`` ids or "other".
        self.tenant_requests = Counter(
            "gateway_tenant_requests_total",
            "Requests of cached routes by tenant and outcome (ok, rate_limited, shed, error).",
            ["tenant", "outcome"], registry=reg,
        )
        self.tenant_texts = Counter(
            "gateway_tenant_texts_total",
            "Texts answered by tenant and source (backend, cache, coalesced).",
            ["tenant", "source"], registry=reg,
        )
        self.tenant_tokens = Counter(
            "gateway_tenant_tokens_total", "Tokens of the texts answered, by tenant.",
            ["tenant"], registry=reg,
        )
        self.tenant_compute = Counter(
            "gateway_tenant_compute_seconds_total",
            "Backend compute time the tenant's requests used (as the backends reported it).",
            ["tenant"], registry=reg,
        )
        self.tenant_saved = Counter(
            "gateway_tenant_compute_saved_seconds_total",
            "Backend compute time cache answers saved the tenant.", ["tenant"], registry=reg,
        )
        self.tenant_rate_limited = Counter(
            "gateway_tenant_rate_limited_total",
            "Requests refused with 429, by tenant and limit (requests, texts, daily).",
            ["tenant", "limit"], registry=reg,
        )
        self.quota_checks = Counter(
            "gateway_quota_checks_total",
            "Quota checks by who answered (redis, or local while Redis is unreachable or "
            "absent) and result (allowed, limited).",
            ["source", "result"], registry=reg,
        )
        self.tenants_reloads = Counter(
            "gateway_tenants_reloads_total", "Tenants file reloads, by result.", ["result"],
            registry=reg,
        )
        self.policy_decisions = Counter(
            "gateway_policy_decisions_total", "Policy decisions, by rule and decision.",
            ["rule", "decision"], registry=reg,
        )
        self.pii_detections = Counter(
            "gateway_pii_detections_total", "Privacy detector hits, by detector and action.",
            ["detector", "action"], registry=reg,
        )
        self.policy_reloads = Counter(
            "gateway_policy_reloads_total", "Policy reloads, by result (success, failure).",
            ["result"], registry=reg,
        )
        self.policy_shadow_diffs = Counter(
            "gateway_policy_shadow_differences_total",
            "Requests where the shadow policy would decide differently, by active/shadow rule.",
            ["rule", "shadow_rule", "field"], registry=reg,
        )
        self.policy_info = Info(
            "gateway_policy", "The active policy version.", registry=reg,
        ) if not mp else None
        self.policy_version = Gauge(
            "gateway_policy_active", "1 for the active policy version.", ["version"],
            registry=reg, multiprocess_mode="liveall",
        )
        self.redis_circuit_open = Gauge(
            "gateway_redis_circuit_open", "1 while the Redis circuit breaker is open.",
            registry=reg, multiprocess_mode="liveall",
        )
        self.batch_lines = Counter(
            "gateway_batch_lines_total",
            "Batch lines by outcome: completed, failed (an error line), retried (shed or "
            "failed by the backends, tried again later); over the tenant's quota: "
            "quota_sleep (waited a moment), quota_defer (parked until the charge can pass), "
            "quota_fail (no room in the window: a quota_exceeded error line).",
            ["outcome"], registry=reg,
        )
        self.batch_deferred = Counter(
            "gateway_batch_deferred_total",
            "Times a batch line waited so interactive calls keep the capacity, by reason.",
            ["reason"], registry=reg,
        )
        # Read from the shared Redis by every worker: the latest reading is the cluster's.
        self.batch_queue_lines = Gauge(
            "gateway_batch_queue_lines",
            "Lines of unfinished batches not answered yet (all gateways sharing the Redis).",
            registry=reg, multiprocess_mode="mostrecent",
        )
        self.batch_queue_lag = Gauge(
            "gateway_batch_queue_lag_seconds", "Age of the oldest entry in the batch queue.",
            registry=reg, multiprocess_mode="mostrecent",
        )
        self.batch_jobs = Gauge(
            "gateway_batch_jobs", "Unfinished batches, by status (all gateways sharing the Redis).",
            ["status"], registry=reg, multiprocess_mode="mostrecent",
        )
        self.batch_finished = Counter(
            "gateway_batch_jobs_finished_total", "Batches that reached a final status, by status.",
            ["status"], registry=reg,
        )
