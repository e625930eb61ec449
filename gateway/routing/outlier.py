"""Outlier detection on answers, as Envoy's ``outlier_detection`` does it: what each call's
outcome counts for, the success-rate check across the hosts of a tier, and ejection.

``OutlierDetector`` keeps the counts on each ``BackendState`` and ejects; the ``Router`` feeds it
every finished call. ``success_rate_outliers`` is the check itself, a pure function.

- **consecutive_5xx**: every failed call (a 5xx answer other than 503, a malformed answer, a
  connection failure, a reset, a timeout) adds one; a success resets it.
- **consecutive_gateway_failure**: connection failures, resets, timeouts and 502/504 answers add
  one; a success or any other failure resets it (as in Envoy, where a 500 breaks the run).
- **success rate**: every ``outlier_interval_s``, among the hosts of a tier with at least
  ``success_rate_request_volume`` calls in the interval, and only when there are at least
  ``success_rate_minimum_hosts`` of them, a host whose success rate is below
  ``mean - stdev x success_rate_stdev_factor / 1000`` is ejected.

A 503 is the backend shedding load (it answers with ``Retry-After``) and a cancelled call (the
client's deadline, a lost hedge) says nothing about the backend: neither counts for anything.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Literal, TypeVar

from gateway.routing.backends import BackendState
from gateway.routing.config import RoutingSettings
from gateway.telemetry.observer import Observer

BackendResult = Literal[
    "ok", "error", "gateway_error", "conn_error", "timeout", "overloaded", "cancelled",
]
"""How one call to a backend ended, for routing and for the ``outcome`` label of metrics:
``ok`` (2xx, 4xx), ``error`` (500 or another 5xx, a malformed answer, another transport
failure), ``gateway_error`` (502, 504), ``conn_error`` (refused, reset, connect timeout),
``timeout`` (no answer within the per-try timeout), ``overloaded`` (503), ``cancelled``."""

Cause = Literal["consecutive_5xx", "consecutive_gateway_failure", "success_rate"]
"""Why a backend was ejected (the ``cause`` label of ``gateway_backend_ejections_total``)."""

GATEWAY_FAILURES: frozenset[str] = frozenset({"gateway_error", "conn_error", "timeout"})
FAILURES: frozenset[str] = GATEWAY_FAILURES | {"error"}
NEUTRAL: frozenset[str] = frozenset({"overloaded", "cancelled"})

H = TypeVar("H", bound=Hashable)

log = logging.getLogger("gateway.routing.balancer")  # where operators have always seen ejections


def success_rate_outliers(
    counts: Mapping[H, tuple[int, int]], *, minimum_hosts: int, request_volume: int,
    stdev_factor: int,
) -> list[H]:
    """The hosts whose success rate is an outlier among ``counts`` (host -> (successes,
    calls) in the interval), in the order given; Envoy's success-rate ejection.

    Hosts with fewer than ``request_volume`` calls take no part; with fewer than
    ``minimum_hosts`` taking part (or ``minimum_hosts`` 0) nothing is an outlier.
    """
    if minimum_hosts <= 0:
        return []
    rates = {h: 100.0 * ok / calls for h, (ok, calls) in counts.items()
             if calls >= request_volume}
    if len(rates) < minimum_hosts:
        return []
    mean = sum(rates.values()) / len(rates)
    stdev = math.sqrt(sum((r - mean) ** 2 for r in rates.values()) / len(rates))
    threshold = mean - stdev * (stdev_factor / 1000.0)
    return [h for h, r in rates.items() if r < threshold]


class OutlierDetector:
    """Counts every finished call for its backend and ejects outliers: ``base_ejection_s``
    doubled on every repeat (back to the base once a backend stayed in for a full
    ``max_ejection_s``), capped at ``max_ejection_s``, never more than ``max_ejected_percent``
    of the backends and never the last available one. An ejected backend's slow start begins
    when its ejection ends."""

    def __init__(
        self, tiers: Sequence[Sequence[BackendState]], settings: RoutingSettings, *,
        clock: Callable[[], float], observer: Observer,
        on_eject: Callable[[BackendState, float], None],
    ) -> None:
        self._tiers = [list(members) for members in tiers]
        self._states = [s for members in self._tiers for s in members]
        self._settings = settings
        self._clock = clock
        self._observer = observer
        self._on_eject = on_eject
        self._next_check = clock() + settings.outlier_interval_s

    def record(self, state: BackendState, outcome: BackendResult) -> None:
        """One finished call; runs the success-rate check when it is due."""
        if outcome == "ok":
            state.consecutive_5xx = state.consecutive_gateway_failures = 0
            state.interval_calls += 1
            state.interval_successes += 1
        elif outcome not in NEUTRAL:
            self._failure(state, outcome)
        self.check_when_due()

    def check_when_due(self) -> None:
        """The success-rate check, if ``outlier_interval_s`` has passed since the last one."""
        if self._clock() >= self._next_check:
            self.check_success_rates()

    def _failure(self, state: BackendState, outcome: BackendResult) -> None:
        settings = self._settings
        state.interval_calls += 1
        if outcome in FAILURES:
            state.consecutive_5xx += 1
        if outcome in GATEWAY_FAILURES:
            state.consecutive_gateway_failures += 1
        else:
            state.consecutive_gateway_failures = 0  # as Envoy: a 500 breaks the run
        if (settings.consecutive_gateway_failure
                and state.consecutive_gateway_failures >= settings.consecutive_gateway_failure):
            self.eject(state, "consecutive_gateway_failure")
        elif settings.consecutive_5xx and state.consecutive_5xx >= settings.consecutive_5xx:
            self.eject(state, "consecutive_5xx")

    def check_success_rates(self) -> list[BackendState]:
        """Envoy's success-rate check over the interval that ends now, tier by tier; ejects the
        outliers (within the max-ejected share) and starts the next interval."""
        settings = self._settings
        self._next_check = self._clock() + settings.outlier_interval_s
        ejected: list[BackendState] = []
        for members in self._tiers:
            counts = {s: (s.interval_successes, s.interval_calls) for s in members}
            for state in success_rate_outliers(
                counts, minimum_hosts=settings.success_rate_minimum_hosts,
                request_volume=settings.success_rate_request_volume,
                stdev_factor=settings.success_rate_stdev_factor,
            ):
                if self.eject(state, "success_rate"):
                    ejected.append(state)
        for state in self._states:
            state.interval_calls = state.interval_successes = 0
        return ejected

    def eject(self, state: BackendState, cause: Cause) -> bool:
        """Eject ``state`` unless it already is out or the limits forbid it; True if it was."""
        settings, now = self._settings, self._clock()
        if state.ejected(now):
            return False
        ejected = sum(1 for s in self._states if s.ejected(now))
        if (ejected + 1) * 100 > settings.max_ejected_percent * len(self._states):
            return False
        if not any(s.available(now) for s in self._states if s is not state):
            return False
        # The doubling resets once the backend has stayed in for a full max_ejection_s.
        if state.ejection_level and now - state.ejected_until > settings.max_ejection_s:
            state.ejection_level = 0
        duration = min(settings.base_ejection_s * 2.0 ** state.ejection_level,
                       settings.max_ejection_s)
        state.ejected_until = now + duration
        state.returned_at = state.ejected_until  # slow start begins when the ejection ends
        state.ejection_level += 1
        state.ejections += 1
        state.consecutive_5xx = state.consecutive_gateway_failures = 0
        log.warning("backend ejected", extra={"backend": state.name, "zone": state.spec.zone,
                                              "ejection_s": duration, "cause": cause})
        self._observer.ejected(state.name, cause)
        self._on_eject(state, now)
        return True
