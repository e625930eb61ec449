"""Slow start: a returning backend's weight and its share of picks over the window."""

from __future__ import annotations

import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.routing import BackendState, Router, RoutingSettings
from gateway.routing.slowstart import slow_start_weight
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.gateway.routing.test_routing_balancer import FakeClock, spec


def router_for(zones: list[str], clock: FakeClock, registry: CollectorRegistry | None = None,
               **settings: Any) -> Router:
    observer = MetricsObserver(GatewayMetrics(registry)) if registry is not None else None
    return Router([spec(i + 1, z) for i, z in enumerate(zones)],
                  RoutingSettings(region="r1", zone="a", **settings), clock=clock,
                  rng=random.Random(5), observer=observer)


def share(router: Router, state: BackendState, picks: int = 4000) -> float:
    """The share of ``picks`` picks that go to ``state`` (no load: pure draw)."""
    return sum(router.pick() is state for _ in range(picks)) / picks


def test_weight_ramps_from_the_minimum_to_one_over_the_window() -> None:
    def w(t: float, aggression: float = 1.0, minimum: int = 10) -> float:
        return slow_start_weight(t, window_s=10.0, aggression=aggression,
                                 min_weight_percent=minimum)

    assert [w(t) for t in (0.0, 0.5, 1.0)] == [0.1, 0.1, 0.1]  # the floor
    assert [w(t) for t in (2.5, 5.0, 7.5)] == pytest.approx([0.25, 0.5, 0.75])  # linear
    assert w(10.0) == w(60.0) == 1.0
    assert w(2.5, aggression=2.0) == pytest.approx(0.5)  # faster at first: sqrt
    assert w(2.5, aggression=0.5) == pytest.approx(0.1)  # slower at first: squared, floored
    assert w(0.0, minimum=30) == 0.3
    assert slow_start_weight(3.0, window_s=0.0, aggression=1.0, min_weight_percent=10) == 1.0


def test_a_backend_back_from_health_failure_ramps_up_its_share() -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    router = router_for(["a", "a"], clock, registry, slow_start_window_s=10.0)
    steady, back = router.states
    assert router.weight(back) == 1.0 and share(router, back) == pytest.approx(0.5, abs=0.05)
    router.set_health(back, False)
    assert share(router, back) == 0.0
    router.set_health(back, True)
    labels = {"backend": back.name, "zone": "a"}
    assert registry.get_sample_value("gateway_backend_slow_start", labels) == 1.0
    shares = []
    for _ in range(5):  # t = 0, 2.5, 5, 7.5, 10 s after it came back
        shares.append(share(router, back))
        clock.now += 2.5
    # Half the traffic at full weight: the weight's share of that half, then all of it.
    assert shares[0] == pytest.approx(0.05, abs=0.02)
    assert shares[1] == pytest.approx(0.125, abs=0.03)
    assert shares[2] == pytest.approx(0.25, abs=0.03)
    assert shares[3] == pytest.approx(0.375, abs=0.03)
    assert shares[4] == pytest.approx(0.5, abs=0.03)
    router.refresh_gauges()
    assert registry.get_sample_value("gateway_backend_slow_start", labels) == 0.0
    assert not router.in_slow_start(back) and router.weight(steady) == 1.0


def test_slow_start_begins_when_an_ejection_ends() -> None:
    clock = FakeClock()
    router = router_for(["a", "a", "a"], clock, slow_start_window_s=4.0, base_ejection_s=2.0,
                        consecutive_gateway_failure=1)
    router.on_start(router.states[0])
    router.on_finish(router.states[0], latency_s=0.01, outcome="conn_error")
    bad = router.states[0]
    assert not bad.available(clock()) and not router.in_slow_start(bad)
    clock.now += 2.0  # the ejection is over: back, at the minimum weight
    assert router.in_slow_start(bad) and router.weight(bad) == pytest.approx(0.1)
    clock.now += 2.0
    assert router.weight(bad) == pytest.approx(0.5)
    clock.now += 2.0
    assert router.weight(bad) == 1.0 and not router.in_slow_start(bad)


def test_a_backend_alone_in_its_tier_takes_the_tier_at_once() -> None:
    clock = FakeClock()
    router = router_for(["a", "b"], clock, slow_start_window_s=10.0)
    near, far = router.states
    router.set_health(near, False)
    assert router.pick() is far
    router.set_health(near, True)
    assert router.in_slow_start(near)
    assert all(router.pick() is near for _ in range(200))  # no spill to the far tier


def test_several_returning_together_share_their_tier_and_zero_window_is_off() -> None:
    clock = FakeClock()
    router = router_for(["a", "a"], clock, slow_start_window_s=10.0)
    for state in router.states:
        router.set_health(state, False)
        router.set_health(state, True)
    picks = [router.pick() for _ in range(4000)]
    assert None not in picks  # all in slow start: the tier is still theirs, shared evenly
    assert picks.count(router.states[0]) / len(picks) == pytest.approx(0.5, abs=0.05)

    off = router_for(["a", "a"], clock, slow_start_window_s=0.0)
    off.set_health(off.states[1], False)
    off.set_health(off.states[1], True)
    assert off.weight(off.states[1]) == 1.0 and not off.in_slow_start(off.states[1])
    assert share(off, off.states[1]) == pytest.approx(0.5, abs=0.05)


def test_initial_backends_start_at_full_weight() -> None:
    clock = FakeClock()
    router = router_for(["a", "a"], clock, slow_start_window_s=10.0)
    assert all(router.weight(s) == 1.0 for s in router.states)
    assert not any(router.in_slow_start(s) for s in router.states)
