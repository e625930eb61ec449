"""One point of the dashboard's history: what the host did in the last second.

A ``Reading`` is the cumulative state of the registry at one instant (counters, histogram
buckets, gauges); a point is the difference of two readings, so it holds what happened between
them, whichever worker did it (with several workers the registry is the multiprocess collector,
which reads every worker's files). Definitions match the stats snapshot (gateway/http/stats.py):

- ``requests``: inference requests answered in the interval, by ``X-Cache``;
- ``items``: items by final cache result; ``hit_ratio``: served (hit, stale) over eligible
  (hit, stale, miss, coalesced) items of the interval, ``None`` when none were eligible;
- ``tier_hit_ratio``: fresh hits over lookups in each tier, in the interval;
- ``latency_s``: per cache result, the requests of the interval and p50/p95/p99 estimated from
  the request-duration histogram's bucket differences (as ``histogram_quantile`` over a
  one-second ``rate`` would);
- ``shed``: requests shed in the interval, by reason;
- ``queue_depth``, ``inflight``: the admission gauges per backend tier at the end of the
  interval (summed over live workers);
- ``backend_busy``: per backend, the seconds its calls took per second of the interval: by
  Little's law the mean number of calls in flight to it (calls finished in the interval, all
  workers).

Counts are counts, not rates: ``dt`` (seconds) says how long the interval was, and a chart
divides. Zero counts are left out to keep points small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.telemetry.samples import (
    ELIGIBLE,
    QUANTILES,
    SERVED,
    Buckets,
    Labels,
    Samples,
    histogram_quantile,
    is_inference_route,
)

Point = dict[str, Any]


def _inference(labels: Labels) -> bool:
    return is_inference_route(labels.get("route", ""))


@dataclass(frozen=True)
class Reading:
    """Cumulative values of the registry at one instant (``mono``: ``time.monotonic()``)."""

    mono: float
    requests: Mapping[str, float] = field(default_factory=dict)
    items: Mapping[str, float] = field(default_factory=dict)
    lookups: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    latency: Mapping[str, Buckets] = field(default_factory=dict)
    shed: Mapping[str, float] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)
    queue_depth: Mapping[str, float] = field(default_factory=dict)
    inflight: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, s: Samples, mono: float) -> Reading:
        """The reading of one collection of the registry."""
        lookups: dict[str, dict[str, float]] = {}
        for labels, value in s.series("gateway_cache_lookups_total"):
            tier = lookups.setdefault(labels.get("tier", ""), {})
            result = labels.get("result", "")
            tier[result] = tier.get(result, 0.0) + value
        return cls(
            mono=mono,
            requests=s.sum_by("gateway_requests_total", "cache", _inference),
            items=s.sum_by("gateway_cache_items_total", "result"),
            lookups=lookups,
            latency=s.histograms("gateway_request_duration_seconds", "cache", _inference),
            shed=s.sum_by("gateway_shed_total", "reason"),
            busy=s.sum_by("gateway_upstream_duration_seconds_sum", "backend"),
            queue_depth=s.sum_by("gateway_queue_depth", "tier"),
            inflight=s.sum_by("gateway_upstream_inflight", "tier"),
        )


def _delta(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Per key ``now - before``, zero and negative differences (a reset) left out."""
    out = {}
    for key, value in now.items():
        d = value - before.get(key, 0.0)
        if d > 0:
            out[key] = d
    return out


def _bucket_delta(now: Buckets, before: Buckets) -> Buckets:
    old = dict(before)
    return [(bound, max(0.0, count - old.get(bound, 0.0))) for bound, count in now]


def _served_ratio(items: Mapping[str, float]) -> float | None:
    eligible = sum(items.get(r, 0.0) for r in ELIGIBLE)
    return sum(items.get(r, 0.0) for r in SERVED) / eligible if eligible > 0 else None


def point(before: Reading, now: Reading, t: float) -> Point:
    """What happened between two readings; ``t`` is the wall time of ``now`` (epoch seconds)."""
    dt = max(1e-6, now.mono - before.mono)
    tiers: dict[str, float | None] = {}
    for tier, results in now.lookups.items():
        d = _delta(results, before.lookups.get(tier, {}))
        lookups = sum(d.values())
        tiers[tier] = d.get("hit", 0.0) / lookups if lookups > 0 else None
    latency: dict[str, dict[str, float | None]] = {}
    for cache, buckets in now.latency.items():
        interval = _bucket_delta(buckets, before.latency.get(cache, []))
        if interval and interval[-1][1] > 0:
            q: dict[str, float | None] = {"count": interval[-1][1]}
            for key, quantile in QUANTILES:
                q[key] = histogram_quantile(quantile, interval)
            latency[cache] = q
    items = _delta(now.items, before.items)
    return {
        "t": round(t, 3),
        "dt": round(dt, 4),
        "requests": _delta(now.requests, before.requests),
        "items": items,
        "hit_ratio": _served_ratio(items),
        "tier_hit_ratio": tiers,
        "latency_s": latency,
        "shed": _delta(now.shed, before.shed),
        "queue_depth": dict(now.queue_depth),
        "inflight": dict(now.inflight),
        "backend_busy": {k: round(v / dt, 4) for k, v in _delta(now.busy, before.busy).items()},
    }
