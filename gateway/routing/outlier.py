"""Outlier detection on answers, as Envoy's ``outlier_detection`` does it: what each call's
outcome counts for, and the success-rate check across the hosts of a tier.

Pure functions over counts; the ``Router`` keeps the counts and ejects.

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

import math
from collections.abc import Hashable, Mapping
from typing import Literal, TypeVar

Outcome = Literal[
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
