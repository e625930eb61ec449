"""Bounded tenant labels for Prometheus: ``TenantLabels``.

Tenant ids are unbounded in principle, Prometheus labels must not be: ``TenantLabels`` names the
``top`` busiest tenants of this process and counts the rest as ``other``. Places are given as
tenants first appear while some are free; after that, once a minute, a tenant counted as
``other`` that sent more in the last minute than the quietest named one takes its place (at
most a quarter of the places per minute). A tenant that loses its place keeps its series
(counters never go back) but adds to ``other`` from then on, so sums over tenants stay right.
Imports nothing of the gateway (gateway/telemetry/observer.py uses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

OTHER = "other"
_REFRESH_S = 60.0
_MAX_SEEN = 10_000


class TenantLabels:
    """Tenant id -> Prometheus label value, at most ``top`` named (see the module docstring)."""

    def __init__(self, top: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.top = top
        self._clock = clock
        self._named: dict[str, int] = {}  # named tenant -> requests this window
        self._others: dict[str, int] = {}  # tenant counted as other -> requests this window
        self._next = clock() + _REFRESH_S

    @property
    def named(self) -> frozenset[str]:
        return frozenset(self._named)

    def label(self, tenant: str, requests: int = 1) -> str:
        """The label to count one request (or ``requests``) of ``tenant`` under."""
        named = self._named
        if tenant in named:
            named[tenant] += requests
            label = tenant
        elif len(named) < self.top:
            named[tenant] = requests
            label = tenant
        else:
            if tenant in self._others or len(self._others) < _MAX_SEEN:
                self._others[tenant] = self._others.get(tenant, 0) + requests
            label = OTHER
        if self._clock() >= self._next:
            self._refresh()
        return label

    def of(self, tenant: str) -> str:
        """The label ``tenant`` is counted under now, without counting a request."""
        if tenant in self._named:
            return tenant
        if len(self._named) < self.top:
            self._named[tenant] = 0
            return tenant
        return OTHER

    def _refresh(self) -> None:
        self._next = self._clock() + _REFRESH_S
        busy = sorted(self._others.items(), key=lambda kv: -kv[1])
        quiet = sorted(self._named.items(), key=lambda kv: kv[1])
        swaps = list(zip(busy, quiet, strict=False))[:max(1, self.top // 4)]
        for (new, count), (old, old_count) in swaps:
            if count <= old_count:
                break
            del self._named[old]
            self._named[new] = 0
        self._named = dict.fromkeys(self._named, 0)
        self._others = {}
