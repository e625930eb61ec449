"""Locality-tiered power-of-two-choices balancing with passive outlier ejection.

Backends fall into tiers by locality relative to the gateway: ``zone`` (same region and zone),
``region`` (same region) and ``remote`` (the rest). ``Router.pick`` takes the nearest tier that
still has an available backend (healthy, not ejected, not saturated) and within it compares two
random candidates on ``(inflight + 1) * latency EWMA``, the cost of one more call there.

Passive ejection follows Envoy's outlier detection: N consecutive failures eject a backend for
``base_ejection_s * 2**level`` (capped), never more than ``max_ejected_percent`` of the backends
and never the last available one.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from gateway.observe import NullObserver, Observer
from gateway.routing.backends import BackendState
from gateway.routing.config import BackendSpec, RoutingSettings

Tier = Literal["zone", "region", "remote"]
Outcome = Literal["ok", "error", "conn_error", "overloaded", "timeout", "cancelled"]
TIER_ORDER: tuple[Tier, ...] = ("zone", "region", "remote")
_FAILURES: frozenset[str] = frozenset({"error", "conn_error", "timeout"})

log = logging.getLogger(__name__)


def version_sort_key(version: str) -> tuple[int, int, str]:
    """Sort key for model versions."""
    # Numeric versions compare as numbers ("10" > "9"); others fall back to text order.
    if version.isascii() and version.isdigit():
        return (1, int(version), version)
    return (0, 0, version)


class Router:
    """Picks a backend per call and keeps each backend's load, latency and ejection state."""

    def __init__(
        self,
        specs: Sequence[BackendSpec],
        settings: RoutingSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        observer: Observer | None = None,
    ) -> None:
        if not specs:
            raise ValueError("backends: at least one backend is required")
        names = [spec.label for spec in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"backends: duplicate backend names {duplicates}")
        self._settings = settings
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._observer: Observer = observer or NullObserver()
        self._states = [BackendState(spec) for spec in specs]
        self._tier: dict[BackendState, Tier] = {s: self._locality(s.spec) for s in self._states}
        self._tiers: list[tuple[Tier, list[BackendState]]] = [
            (t, [s for s in self._states if self._tier[s] == t]) for t in TIER_ORDER
        ]
        self._tiers = [(t, members) for t, members in self._tiers if members]
        self._versions: dict[str, str | None] = {}
        self._widths: dict[str, int] = {}
        self.refresh_gauges()

    def _locality(self, spec: BackendSpec) -> Tier:
        if spec.region != self._settings.region:
            return "remote"
        return "zone" if spec.zone == self._settings.zone else "region"

    @property
    def states(self) -> Sequence[BackendState]:
        """Every backend, in configuration order."""
        return self._states

    def tier_of(self, state: BackendState) -> Tier:
        """The locality tier of a backend."""
        return self._tier[state]

    def tiers(self) -> list[tuple[Tier, list[BackendState]]]:
        """Non-empty tiers, nearest first."""
        return [(t, list(members)) for t, members in self._tiers]

    def now(self) -> float:
        """The router's clock (the one ejection times are on)."""
        return self._clock()

    def _saturated(self, state: BackendState) -> bool:
        limit = self._settings.max_inflight_per_backend
        return limit is not None and state.inflight >= limit

    def pick(
        self, exclude: Collection[BackendState] = (), *, tiers: Collection[str] | None = None,
    ) -> BackendState | None:
        """The backend for the next call, or ``None`` when no tier has capacity left.

        ``exclude`` leaves out backends already tried; ``tiers`` restricts the choice.
        """
        now = self._clock()
        for tier, members in self._tiers:
            if tiers is not None and tier not in tiers:
                continue
            candidates = [
                s for s in members
                if s.available(now) and s not in exclude and not self._saturated(s)
            ]
            if not candidates:
                continue
            if len(candidates) == 1:
                return candidates[0]
            a, b = self._rng.sample(candidates, 2)
            return a if self._cost(a, b) <= self._cost(b, a) else b
        return None

    @staticmethod
    def _cost(state: BackendState, other: BackendState) -> float:
        # A backend without samples borrows its rival's EWMA, so the pair compares on load alone
        # instead of the unknown one looking free (a hung new backend would attract everything).
        if state.samples:
            latency = state.ewma_s
        elif other.samples:
            latency = other.ewma_s
        else:
            latency = 1.0
        return (state.inflight + 1) * latency

    def on_start(self, state: BackendState) -> None:
        """A call to ``state`` begins."""
        state.inflight += 1

    def on_finish(self, state: BackendState, *, latency_s: float, outcome: Outcome) -> None:
        """A call to ``state`` ended: update its EWMA, failure count and maybe eject it.

        ``cancelled`` (deadline passed or a hedge lost) only raises the EWMA when the elapsed
        time already exceeds it, since the true latency is at least that. Failures count as slow
        samples so a backend that fails fast does not attract traffic.
        """
        state.inflight = max(0, state.inflight - 1)
        if outcome == "ok":
            self._sample(state, latency_s)
            state.consecutive_failures = 0
            return
        if outcome == "cancelled":
            if latency_s > state.ewma_s:
                self._sample(state, latency_s)
            return
        if state.samples or outcome == "timeout":
            self._sample(state, max(latency_s, 2.0 * state.ewma_s))
        if outcome in _FAILURES:
            state.consecutive_failures += 1
            if state.consecutive_failures >= self._settings.eject_after_failures:
                self._maybe_eject(state)

    def _sample(self, state: BackendState, latency_s: float) -> None:
        alpha = self._settings.ewma_alpha
        state.ewma_s = latency_s if not state.samples else (
            alpha * latency_s + (1.0 - alpha) * state.ewma_s
        )
        state.samples += 1

    def _maybe_eject(self, state: BackendState) -> bool:
        now = self._clock()
        if state.ejected(now):
            return False
        ejected = sum(1 for s in self._states if s.ejected(now))
        if (ejected + 1) * 100 > self._settings.max_ejected_percent * len(self._states):
            return False
        if not any(s.available(now) for s in self._states if s is not state):
            return False
        # The doubling resets once the backend has stayed in for a full max_ejection_s.
        if state.ejection_level and now - state.ejected_until > self._settings.max_ejection_s:
            state.ejection_level = 0
        duration = min(
            self._settings.base_ejection_s * 2.0 ** state.ejection_level,
            self._settings.max_ejection_s,
        )
        state.ejected_until = now + duration
        state.ejection_level += 1
        state.ejections += 1
        state.consecutive_failures = 0
        log.warning(
            "backend ejected",
            extra={"backend": state.name, "zone": state.spec.zone, "ejection_s": duration},
        )
        self._observer.ejected(state.name)
        self._gauge(state, now)
        return True

    def set_health(self, state: BackendState, healthy: bool) -> bool:
        """Record an active health-check verdict; True when it changed the backend's health.

        It does not cut an ejection short. The health checker logs the change: it knows why
        (a backend still starting up is not a failure).
        """
        changed = state.healthy != healthy
        if changed:
            state.healthy = healthy
            self._versions.clear()
        self._gauge(state, self._clock())
        return changed

    def set_model_versions(self, state: BackendState, versions: Mapping[str, str]) -> None:
        """Record the model versions a backend's metadata reports."""
        if state.model_versions != versions:
            state.model_versions = dict(versions)
            self._versions.clear()

    def model_version(self, model: str) -> str | None:
        """The version of ``model`` that the healthy backends report: most common, then highest.

        Recomputed on every health or version change, so a new version shows at once.
        """
        if model in self._versions:
            return self._versions[model]
        found = [s.model_versions[model] for s in self._states
                 if s.healthy and model in s.model_versions]
        if not found:
            found = [s.model_versions[model] for s in self._states if model in s.model_versions]
        version: str | None = None
        if found:
            counts = Counter(found)
            version = max(counts, key=lambda v: (counts[v], version_sort_key(v)))
        self._versions[model] = version
        return version

    def set_model_width(self, model: str, width: int) -> None:
        """Record a model's embedding size (from its metadata, or from an answer)."""
        self._widths[model] = width

    def model_width(self, model: str) -> int | None:
        """The model's embedding size, once a backend's metadata or answer told it."""
        return self._widths.get(model)

    def ready(self) -> bool:
        """At least one backend passes its health checks."""
        return any(s.healthy for s in self._states)

    def refresh_gauges(self) -> None:
        """Bring the per-backend health gauges up to date (ejections expire silently)."""
        now = self._clock()
        for state in self._states:
            self._gauge(state, now)

    def _gauge(self, state: BackendState, now: float) -> None:
        self._observer.backend_health(state.name, state.spec.zone, state.available(now))
