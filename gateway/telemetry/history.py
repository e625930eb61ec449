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
- ``limit``: the concurrency limit per tier at the end of the interval (the adaptive one when
  on; summed over live workers, like ``inflight``, which it bounds);
- ``queue_by_class``: per tier, the requests waiting for a slot per priority class
  (``interactive``, ``batch``) at the end of the interval;
- ``queue_wait_s``: per priority class, the calls that stopped waiting for a slot in the
  interval (granted after queueing, or gave up; calls granted at once are not counted) and
  p50/p99 of how long they waited,
  from the ``gateway_queue_wait_seconds`` buckets' differences (all tiers and outcomes);
- ``backend_queue_s``: per backend, the calls of the interval and p50/p99 of the queue time
  the backend reported (inside the model server, where the gateway's order cannot act);
- ``backend_busy``: per backend, the seconds its calls took per second of the interval: by
  Little's law the mean number of calls in flight to it (calls finished in the interval, all
  workers).

Counts are counts, not rates: ``dt`` (seconds) says how long the interval was, and a chart
divides. Zero counts are left out to keep points small, and so are zero queue depths per class
and classes or backends with no call in the interval (``queue_depth`` and ``inflight`` keep
their zeros); of ``limit``, ``queue_by_class``, ``queue_wait_s`` and ``backend_queue_s`` an
empty one is left out of the point altogether.
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
    limit: Mapping[str, float] = field(default_factory=dict)
    queue_by_class: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    queue_wait: Mapping[str, Buckets] = field(default_factory=dict)
    backend_queue: Mapping[str, Buckets] = field(default_factory=dict)

    @classmethod
    def of(cls, s: Samples, mono: float) -> Reading:
        """The reading of one collection of the registry."""
        lookups: dict[str, dict[str, float]] = {}
        for labels, value in s.series("gateway_cache_lookups_total"):
            tier = lookups.setdefault(labels.get("tier", ""), {})
            result = labels.get("result", "")
            tier[result] = tier.get(result, 0.0) + value
        by_class: dict[str, dict[str, float]] = {}
        for labels, value in s.series("gateway_queue_depth"):
            if value > 0:
                depths = by_class.setdefault(labels.get("tier", ""), {})
                name = labels.get("class", "")
                depths[name] = depths.get(name, 0.0) + value
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
            limit=s.sum_by("gateway_concurrency_limit", "tier"),
            queue_by_class=by_class,
            queue_wait=s.histograms("gateway_queue_wait_seconds", "class"),
            backend_queue=s.histograms("gateway_upstream_queue_seconds", "backend"),
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


def _interval(
    now: Mapping[str, Buckets], before: Mapping[str, Buckets],
    quantiles: tuple[tuple[str, float], ...] = QUANTILES,
) -> dict[str, dict[str, float | None]]:
    """Per key with observations in the interval: their count and ``quantiles`` (seconds),
    from the buckets' differences."""
    out: dict[str, dict[str, float | None]] = {}
    for key, buckets in now.items():
        interval = _bucket_delta(buckets, before.get(key, []))
        if interval and interval[-1][1] > 0:
            q: dict[str, float | None] = {"count": interval[-1][1]}
            for name, quantile in quantiles:
                q[name] = histogram_quantile(quantile, interval)
            out[key] = q
    return out


_TAILS = (("p50", 0.50), ("p99", 0.99))


def point(before: Reading, now: Reading, t: float) -> Point:
    """What happened between two readings; ``t`` is the wall time of ``now`` (epoch seconds)."""
    dt = max(1e-6, now.mono - before.mono)
    tiers: dict[str, float | None] = {}
    for tier, results in now.lookups.items():
        d = _delta(results, before.lookups.get(tier, {}))
        lookups = sum(d.values())
        tiers[tier] = d.get("hit", 0.0) / lookups if lookups > 0 else None
    items = _delta(now.items, before.items)
    p: Point = {
        "t": round(t, 3),
        "dt": round(dt, 4),
        "requests": _delta(now.requests, before.requests),
        "items": items,
        "hit_ratio": _served_ratio(items),
        "tier_hit_ratio": tiers,
        "latency_s": _interval(now.latency, before.latency),
        "shed": _delta(now.shed, before.shed),
        "queue_depth": dict(now.queue_depth),
        "inflight": dict(now.inflight),
        "backend_busy": {k: round(v / dt, 4) for k, v in _delta(now.busy, before.busy).items()},
    }
    scheduling = {
        "limit": {k: v for k, v in now.limit.items() if v > 0},
        "queue_by_class": {k: dict(v) for k, v in now.queue_by_class.items()},
        "queue_wait_s": _interval(now.queue_wait, before.queue_wait, _TAILS),
        "backend_queue_s": _interval(now.backend_queue, before.backend_queue, _TAILS),
    }
    p.update((key, value) for key, value in scheduling.items() if value)
    return p
