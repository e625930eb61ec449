"""Reading the Prometheus registry back: ``Samples`` (one collection, summed by labels), histogram
quantiles estimated as Prometheus' ``histogram_quantile`` does, and the cache results the hit
ratio counts. Shared by the stats snapshot (gateway/http/stats.py) and the dashboard's history
(history.py); pure, no I/O beyond the ``collect()`` it is handed."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Labels = Mapping[str, str]
Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), sorted by bound

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
SERVED = ("hit", "stale")
ELIGIBLE = ("hit", "stale", "miss", "coalesced")


def is_inference_route(route: str) -> bool:
    """Routes that carry model traffic (the ones dashboards count), by their route pattern."""
    return route.startswith("/v1/") or route.endswith("/infer")


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a cumulative histogram, as Prometheus estimates it.

    ``buckets`` are ``(upper bound, cumulative count)`` sorted by bound, ending with ``+Inf``.
    Linear interpolation inside the bucket that holds the rank (from 0 for the first bucket); a
    rank in the ``+Inf`` bucket answers the largest finite bound. ``None`` without observations.
    """
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        if not math.isinf(upper):
            lower = upper
        below = cumulative
    return lower


def ratio(part: float, whole: float) -> float | None:
    """``part / whole``, or ``None`` when there is nothing to divide."""
    return part / whole if whole > 0 else None


class Samples:
    """One collection of a registry, indexed by sample name (``..._total``, ``..._bucket``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._by_name: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for family in registry.collect():
            for sample in family.samples:
                self._by_name[sample.name].append((sample.labels, sample.value))

    def series(self, name: str) -> list[tuple[Labels, float]]:
        """Every ``(labels, value)`` of one sample name."""
        return self._by_name.get(name, [])

    def total(self, name: str, where: Callable[[Labels], bool] | None = None) -> float:
        """Sum of a sample name's values (over the series ``where`` accepts)."""
        return sum(v for labels, v in self.series(name) if where is None or where(labels))

    def sum_by(
        self, name: str, label: str, where: Callable[[Labels], bool] | None = None
    ) -> dict[str, float]:
        """Values summed per value of ``label``."""
        out: dict[str, float] = defaultdict(float)
        for labels, value in self.series(name):
            if where is None or where(labels):
                out[labels.get(label, "")] += value
        return dict(out)

    def histograms(
        self, name: str, label: str, where: Callable[[Labels], bool] | None = None
    ) -> dict[str, Buckets]:
        """Histogram ``name`` merged per value of ``label``: cumulative buckets, sorted."""
        merged: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for labels, value in self.series(f"{name}_bucket"):
            if where is None or where(labels):
                merged[labels.get(label, "")][float(labels["le"])] += value
        return {key: sorted(b.items()) for key, b in merged.items()}


def quantiles(buckets: Buckets) -> dict[str, float | None]:
    """``count`` and p50/p95/p99 (seconds) of one cumulative histogram."""
    out: dict[str, float | None] = {"count": buckets[-1][1] if buckets else 0.0}
    for key, q in QUANTILES:
        out[key] = histogram_quantile(q, buckets)
    return out
