"""Locality-tiered power-of-two-choices balancing with passive outlier ejection.

Backends fall into tiers by locality relative to the gateway: ``zone`` (same region and zone),
``region`` (same region) and ``remote`` (the rest). ``Router.pick`` takes the nearest tier that
still has an available backend (healthy, not ejected, not saturated) and within it compares two
random candidates on ``(inflight + 1) * latency EWMA``, the cost of one more call there. A
backend in slow start (slowstart.py) enters that draw only with the chance of its weight.

Outlier ejection follows Envoy's outlier detection (outlier.py: consecutive 5xx, consecutive
gateway failures, success rate across a tier): an outlier is ejected for
``base_ejection_s * 2**level`` (capped), never more than ``max_ejected_percent`` of the backends
and never the last available one.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from gateway.routing.backends import BackendState
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.routing.outlier import BackendResult, OutlierDetector
from gateway.routing.slowstart import slow_start_weight
from gateway.telemetry.observer import NullObserver, Observer

Tier = Literal["zone", "region", "remote"]
TIER_ORDER: tuple[Tier, ...] = ("zone", "region", "remote")

__all__ = ["TIER_ORDER", "BackendResult", "Router", "Tier", "version_sort_key"]


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
        self._identities: dict[str, str] = {}
        self._widths: dict[str, int] = {}
        self._outliers = OutlierDetector([m for _, m in self._tiers], settings, clock=clock,
                                         observer=self._observer, on_eject=self._gauge)
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
            if len(candidates) > 1:
                # Slow start: a returning backend enters the draw with the chance of its weight;
                # when every candidate sits out, all take part (a lone one gets its tier).
                drawn = [s for s in candidates
                         if (w := self.weight(s, now)) >= 1.0 or self._rng.random() < w]
                candidates = drawn or candidates
            if len(candidates) == 1:
                return candidates[0]
            a, b = self._rng.sample(candidates, 2)
            if self.weight(a, now) < 1.0 or self.weight(b, now) < 1.0:
                # Slow start already sets a returning backend's share (its draw above); its
                # first, cold answers must not also price it out on latency, or it would never
                # get the calls whose samples bring its EWMA down (P2C alone never explores).
                return a if a.inflight <= b.inflight else b
            return a if self._cost(a, b) <= self._cost(b, a) else b
        return None

    def weight(self, state: BackendState, now: float | None = None) -> float:
        """The backend's slow-start weight now: 1 unless it came back less than
        ``slow_start_window_s`` ago."""
        if state.returned_at is None:
            return 1.0
        settings = self._settings
        since = (self._clock() if now is None else now) - state.returned_at
        if since >= settings.slow_start_window_s:
            return 1.0
        return slow_start_weight(since, window_s=settings.slow_start_window_s,
                                 aggression=settings.slow_start_aggression,
                                 min_weight_percent=settings.slow_start_min_weight_percent)

    def in_slow_start(self, state: BackendState, now: float | None = None) -> bool:
        """Available and still ramping up."""
        now = self._clock() if now is None else now
        return state.available(now) and self.weight(state, now) < 1.0

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

    def on_finish(self, state: BackendState, *, latency_s: float, outcome: BackendResult) -> None:
        """A call to ``state`` ended: update its EWMA and outlier counts, maybe eject it.

        ``cancelled`` (deadline passed or a hedge lost) only raises the EWMA when the elapsed
        time already exceeds it, since the true latency is at least that. Failures count as slow
        samples so a backend that fails fast does not attract traffic.
        """
        state.inflight = max(0, state.inflight - 1)
        if outcome == "ok":
            self._sample(state, latency_s)
            phase = state.cold_start.answered(self._clock())
            self._observer.backend_answer(state.name, state.spec.zone, phase, latency_s)
        elif outcome == "cancelled":
            if latency_s > state.ewma_s:
                self._sample(state, latency_s)
        elif state.samples or outcome == "timeout":
            self._sample(state, max(latency_s, 2.0 * state.ewma_s))
        self._outliers.record(state, outcome)

    def check_success_rates(self) -> list[BackendState]:
        """Run the success-rate check now (it runs by itself every ``outlier_interval_s`` as
        calls finish and health checks run); the backends it ejected."""
        return self._outliers.check_success_rates()

    def _sample(self, state: BackendState, latency_s: float) -> None:
        alpha = self._settings.ewma_alpha
        state.ewma_s = latency_s if not state.samples else (
            alpha * latency_s + (1.0 - alpha) * state.ewma_s
        )
        state.samples += 1

    def set_health(self, state: BackendState, healthy: bool) -> bool:
        """Record an active health-check verdict; True when it changed the backend's health.

        It does not cut an ejection short. The health checker logs the change: it knows why
        (a backend still starting up is not a failure).
        """
        changed = state.healthy != healthy
        now = self._clock()
        if changed:
            state.healthy = healthy
            self._versions.clear()
            self._identities.clear()
            if healthy:  # back: slow start, from the end of an ejection still running
                state.returned_at = max(now, state.ejected_until)
                state.cold_start.became_ready(now)
                self._observer.backend_ready(state.name, state.spec.zone,
                                             state.cold_start.readies)
        self._gauge(state, now)
        return changed

    def set_model_versions(self, state: BackendState, versions: Mapping[str, str],
                           identities: Mapping[str, str] | None = None) -> None:
        """Record the model versions (and graph identities) a backend's metadata reports."""
        identities = state.model_identities if identities is None else identities
        if state.model_versions != versions or state.model_identities != identities:
            state.model_versions = dict(versions)
            state.model_identities = dict(identities)
            self._versions.clear()
            self._identities.clear()

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

    def model_identity(self, model: str) -> str:
        """The identity of the graph behind ``model_version(model)`` (its SHA-256, as the
        backends' metadata reports it): the most common among the backends reporting that
        version, healthy ones first; "" when none reports one. The node cache scopes its
        entries by it, so different weights under one name and version never share them."""
        found = self._identities.get(model)
        if found is not None:
            return found
        version = self.model_version(model)
        serving = [s for s in self._states if s.model_versions.get(model) == version]
        reports = [s.model_identities[model] for s in serving
                   if s.healthy and model in s.model_identities]
        if not reports:
            reports = [s.model_identities[model] for s in serving if model in s.model_identities]
        identity = Counter(reports).most_common(1)[0][0] if reports else ""
        self._identities[model] = identity
        return identity

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
        """Bring the per-backend health and slow-start gauges up to date (ejections and slow
        starts end silently), and run a success-rate check that is due."""
        self._outliers.check_when_due()
        now = self._clock()
        for state in self._states:
            self._gauge(state, now)

    def _gauge(self, state: BackendState, now: float) -> None:
        name, zone = state.name, state.spec.zone
        self._observer.backend_health(name, zone, state.available(now))
        self._observer.slow_start(name, zone, self.in_slow_start(state, now))
