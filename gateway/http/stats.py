"""The ops stats snapshot behind ``/admin/stats`` and the ``/dashboard`` page.

Everything countable is read back from the Prometheus registry (``registry.collect()``), never
from counters of its own: with several worker processes the registry is the multiprocess
collector, so any worker answers for the whole gateway. Only what is live state rather than a
metric (backend health and load as this worker's router sees them, the active policy) is read
from the components themselves.

Definitions the page and the tests rely on:

- hit ratio (overall, by model, by tenant): items served from cache (``hit`` + ``stale``) over
  cache-eligible items (``hit`` + ``stale`` + ``miss`` + ``coalesced``); ``bypass`` items (the
  policy or the client said no cache) are left out. ``None`` when nothing was eligible.
- hit ratio by tier: fresh hits over lookups in that tier (the node tier sees only what L1
  missed, L2 only what both missed).
- tier bytes and evictions: bytes a tier holds now (the node tier's pages, as the worker that
  wrote last saw them) and entries it dropped to stay in its bound, from
  ``gateway_cache_bytes`` and ``gateway_cache_evictions_total``.
- latency quantiles: estimated from histogram buckets the way Prometheus' ``histogram_quantile``
  does (linear interpolation inside the bucket), for inference routes only, so the dashboard's
  own polling does not dilute them.

- resilience: retries by the failure retried (``connect_failure``, ``reset``,
  ``per_try_timeout``, ``http_<status>``), retries the retry budget refused (by the same
  reasons), outlier ejections by cause (``consecutive_5xx``, ``consecutive_gateway_failure``,
  ``success_rate``), and per backend whether it is in slow start and its weight now (this
  worker's router).

- cold starts: per backend (this worker's router) how often it became ready, whether its
  first answers after that are still coming, how long after ready the first one came, and
  the latency of those cold answers beside the steady ones
  (``gateway_backend_answer_seconds{phase}``); at the top, the backends cold now and the
  readies in all.

- tenant usage: per tenant label (the busiest ``quotas.top_tenants`` ids, the rest ``other``)
  requests by outcome (ok, rate_limited, shed, error), texts by source (backend, cache,
  coalesced), tokens, backend compute seconds used and saved, 429s by limit, from the
  ``gateway_tenant_*`` counters.

Rates (requests/s, sheds/s, the hit ratio of the last interval) are differences between two
snapshots; the page computes them, so every counter is reported as a lifetime total.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from gateway.telemetry.samples import (
    ELIGIBLE,
    SERVED,
    Labels,
    Samples,
    is_inference_route,
    quantiles,
    ratio,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.policy.store import PolicyStore
    from gateway.routing.balancer import Router

def _items_ratio(counts: Mapping[str, float]) -> float | None:
    return ratio(sum(counts.get(r, 0.0) for r in SERVED),
                 sum(counts.get(r, 0.0) for r in ELIGIBLE))


def _nested(samples: Samples, name: str, outer: str, inner: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in samples.series(name):
        out[labels.get(outer, "")][labels.get(inner, "")] += value
    return {k: dict(v) for k, v in out.items()}


def _top(groups: Mapping[str, Mapping[str, float]], limit: int) -> tuple[dict[str, Any], int]:
    """The ``limit`` busiest groups (by items) with their counts and hit ratio; the rest count."""
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1].values()))
    kept = {
        key: {"counts": dict(counts), "hit_ratio": _items_ratio(counts)}
        for key, counts in ranked[:limit]
    }
    return kept, max(0, len(ranked) - limit)


def _phase_is(phase: str, labels: Labels) -> bool:
    return labels.get("phase") == phase


def _inference(labels: Labels) -> bool:
    return is_inference_route(labels.get("route", ""))


class Stats:
    """Builds the stats snapshot from the registry plus the router's and policies' live state."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        router: Router,
        policies: PolicyStore,
        clock: Callable[[], float] = time.time,
        max_tenants: int = 20,
        redis: bool = False,
    ) -> None:
        self._redis = redis
        self._registry = registry
        self._router = router
        self._policies = policies
        self._clock = clock
        # Tenant ids are unbounded; the page shows the busiest ones and counts the rest.
        self._max_tenants = max_tenants

    def snapshot(self) -> dict[str, Any]:
        """One JSON-ready snapshot (see the module docstring for the definitions)."""
        s = Samples(self._registry)
        by_model = _nested(s, "gateway_cache_items_total", "model", "result")
        by_tenant = _nested(s, "gateway_cache_items_total", "tenant", "result")
        items = s.sum_by("gateway_cache_items_total", "result")
        tenants, omitted = _top(by_tenant, self._max_tenants)
        models, _ = _top(by_model, len(by_model))
        lookups = _nested(s, "gateway_cache_lookups_total", "tier", "result")
        shed = s.sum_by("gateway_shed_total", "reason")
        saved = s.sum_by("gateway_compute_saved_seconds_total", "model")
        latency = s.histograms("gateway_request_duration_seconds", "cache", _inference)
        backends = self._backends(s)
        return {
            "time": self._clock(),
            "policy": self._policy(),
            "requests": {
                "total": s.total("gateway_requests_total", _inference),
                "by_cache": s.sum_by("gateway_requests_total", "cache", _inference),
                "by_status": s.sum_by("gateway_requests_total", "status", _inference),
            },
            "items": {"total": sum(items.values()), "by_result": items},
            "hit_ratio": {
                "overall": _items_ratio(items),
                "by_tier": {
                    tier: ratio(c.get("hit", 0.0), sum(c.values()))
                    for tier, c in sorted(lookups.items())
                },
                "by_model": {k: v["hit_ratio"] for k, v in models.items()},
                "by_tenant": {k: v["hit_ratio"] for k, v in tenants.items()},
            },
            "models": models,
            "tenants": tenants,
            "tenants_omitted": omitted,
            "lookups": lookups,
            "tier_bytes": s.sum_by("gateway_cache_bytes", "tier"),
            "tier_evictions": s.sum_by("gateway_cache_evictions_total", "tier"),
            "latency_s": {cache: quantiles(b) for cache, b in sorted(latency.items())},
            "shed": {"total": sum(shed.values()), "by_reason": shed},
            "resilience": self._resilience(s),
            "compute_saved_s": {"total": sum(saved.values()), "by_model": saved},
            "coalesced": s.total("gateway_coalesced_total"),
            "queue_depth": s.sum_by("gateway_queue_depth", "tier"),
            "inflight": s.sum_by("gateway_upstream_inflight", "tier"),
            "concurrency_limit": s.sum_by("gateway_concurrency_limit", "tier"),
            "redis_circuit_open": s.total("gateway_redis_circuit_open") > 0,
            "redis_configured": self._redis,
            "batch": {
                "lines": s.sum_by("gateway_batch_lines_total", "outcome"),
                "deferred": s.sum_by("gateway_batch_deferred_total", "reason"),
                "queue_lines": s.total("gateway_batch_queue_lines"),
                "queue_lag_s": s.total("gateway_batch_queue_lag_seconds"),
                "jobs": s.sum_by("gateway_batch_jobs", "status"),
                "finished": s.sum_by("gateway_batch_jobs_finished_total", "status"),
            },
            "backends": backends,
            "cold_starts": {
                "backends_cold": sum(1 for b in backends if b["cold_start"]["cold"]),
                "readies": sum(b["cold_start"]["readies"] for b in backends),
            },
            "tenant_usage": tenant_usage(s),
            "quota_checks": _nested(s, "gateway_quota_checks_total", "source", "result"),
        }

    def _policy(self) -> dict[str, Any]:
        shadow = self._policies.shadow
        return {
            "version": self._policies.active.version,
            "shadow_version": shadow.version if shadow is not None else None,
        }

    def _resilience(self, s: Samples) -> dict[str, Any]:
        retries = s.sum_by("gateway_upstream_retries_total", "reason")
        refused = s.sum_by("gateway_upstream_retry_overflow_total", "reason")
        ejections = s.sum_by("gateway_backend_ejections_total", "cause")
        now = self._router.now()
        return {
            "retries": {"total": sum(retries.values()), "by_reason": retries},
            "budget_refused": {"total": sum(refused.values()), "by_reason": refused},
            "ejections": {"total": sum(ejections.values()), "by_cause": ejections},
            "slow_start": sum(self._router.in_slow_start(b, now) for b in self._router.states),
        }

    def _backends(self, s: Samples) -> list[dict[str, Any]]:
        outcomes = _nested(s, "gateway_backend_requests_total", "backend", "outcome")
        ok = s.histograms("gateway_upstream_duration_seconds", "backend",
                          lambda labels: labels.get("outcome") == "ok")
        phases = {phase: s.histograms("gateway_backend_answer_seconds", "backend",
                                      partial(_phase_is, phase))
                  for phase in ("cold", "steady")}
        gauge: dict[str, list[float]] = defaultdict(list)
        for labels, value in s.series("gateway_backend_healthy"):
            gauge[labels.get("backend", "")].append(value)  # one value per worker (liveall)
        now = self._router.now()
        out: list[dict[str, Any]] = []
        for state in self._router.states:
            name = state.name
            calls = outcomes.get(name, {})
            seen = gauge.get(name, [])
            out.append({
                "name": name,
                "url": state.url,
                "region": state.spec.region,
                "zone": state.spec.zone,
                "tier": self._router.tier_of(state),
                "healthy": state.healthy,
                "ejected": state.ejected(now),
                "available": state.available(now),
                "healthy_gauge": sum(seen) / len(seen) if seen else None,
                "inflight": state.inflight,
                "ewma_s": state.ewma_s if state.samples else None,
                "ejections": state.ejections,
                "slow_start": self._router.in_slow_start(state, now),
                "weight": self._router.weight(state, now),
                "model_versions": dict(state.model_versions),
                "requests": sum(calls.values()),
                "errors": sum(v for k, v in calls.items() if k != "ok"),
                "outcomes": calls,
                "latency_s": quantiles(ok.get(name, [])),
                "cold_start": {
                    **state.cold_start.snapshot(now),
                    "latency_s": {phase: quantiles(by.get(name, []))
                                  for phase, by in phases.items()},
                },
            })
        return out


def tenant_usage(s: Samples) -> dict[str, dict[str, Any]]:
    """Per tenant label: the ``gateway_tenant_*`` counters (see the module docstring)."""
    requests = _nested(s, "gateway_tenant_requests_total", "tenant", "outcome")
    texts = _nested(s, "gateway_tenant_texts_total", "tenant", "source")
    limited = _nested(s, "gateway_tenant_rate_limited_total", "tenant", "limit")
    tokens = s.sum_by("gateway_tenant_tokens_total", "tenant")
    compute = s.sum_by("gateway_tenant_compute_seconds_total", "tenant")
    saved = s.sum_by("gateway_tenant_compute_saved_seconds_total", "tenant")
    names = set(requests) | set(texts) | set(limited) | set(tokens) | set(compute) | set(saved)
    ranked = sorted(names, key=lambda t: -sum(requests.get(t, {}).values()))
    return {t: {
        "requests": requests.get(t, {}),
        "texts": texts.get(t, {}),
        "tokens": tokens.get(t, 0.0),
        "compute_s": compute.get(t, 0.0),
        "compute_saved_s": saved.get(t, 0.0),
        "rate_limited": limited.get(t, {}),
    } for t in ranked}
