"""Slow start, as Envoy's ``slow_start_config``: a backend that comes back gets a weight that
ramps from ``min_weight_percent`` to 1 over ``slow_start_window_s``.

A backend comes back when its ejection ends or its health checks pass again after failing; a
backend of the initial set is not in slow start (nothing says it is cold). The weight is
``max(min_weight, (t / window) ** (1 / aggression))`` for ``t`` seconds since it came back,
Envoy's formula on a continuous clock (Envoy counts whole seconds, at least one).

The balancer uses it as the chance that the backend enters the power-of-two-choices draw at
all: at weight ``w`` it gets about ``w`` of the share of traffic its load and latency would
win it. When every candidate of a tier sits out, the draw takes them all, so a backend alone in
its tier takes that tier's traffic at once (as in Envoy, where weights only divide traffic
among hosts).
"""

from __future__ import annotations


def slow_start_weight(since_s: float, *, window_s: float, aggression: float,
                      min_weight_percent: int) -> float:
    """The weight (0-1] of a backend ``since_s`` seconds after it came back."""
    if window_s <= 0 or since_s >= window_s:
        return 1.0
    ramp = max(since_s, 0.0) / window_s
    return max(min_weight_percent / 100.0, float(ramp ** (1.0 / aggression)))
