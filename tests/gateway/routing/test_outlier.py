"""Outlier detection on answers: consecutive 5xx, consecutive gateway failures, success rate."""

from __future__ import annotations

import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.routing import BackendState, Router, RoutingSettings
from gateway.routing.outlier import success_rate_outliers
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.gateway.routing.test_routing_balancer import FakeClock, spec


def router_for(n: int, clock: FakeClock, registry: CollectorRegistry | None = None,
               zones: list[str] | None = None, **settings: Any) -> Router:
    specs = [spec(i + 1, (zones or ["a"] * n)[i]) for i in range(n)]
    observer = MetricsObserver(GatewayMetrics(registry)) if registry is not None else None
    return Router(specs, RoutingSettings(region="r1", zone="a", **settings), clock=clock,
                  rng=random.Random(1), observer=observer)


def finish(router: Router, state: BackendState, outcome: str, times: int = 1) -> None:
    for _ in range(times):
        router.on_start(state)
        router.on_finish(state, latency_s=0.01, outcome=outcome)  # type: ignore[arg-type]


def ejections(registry: CollectorRegistry, state: BackendState, cause: str) -> float:
    return registry.get_sample_value(
        "gateway_backend_ejections_total", {"backend": state.name, "cause": cause}) or 0.0


def test_success_rate_math_follows_envoy() -> None:
    # Rates 100, 100, 100, 100, 50: mean 90, stdev 20; 1.9 stdev below the mean is 52.
    counts = {"a": (100, 100), "b": (100, 100), "c": (100, 100), "d": (100, 100),
              "e": (50, 100)}
    kw = {"minimum_hosts": 5, "request_volume": 100}
    assert success_rate_outliers(counts, stdev_factor=1900, **kw) == ["e"]
    assert success_rate_outliers(counts, stdev_factor=2000, **kw) == []  # 50 is not below 50
    assert success_rate_outliers(counts, stdev_factor=1900, minimum_hosts=6,
                                 request_volume=100) == []  # too few hosts
    low_volume = {**counts, "e": (49, 99)}
    assert success_rate_outliers(low_volume, stdev_factor=1900, **kw) == []  # e takes no part
    assert success_rate_outliers(counts, stdev_factor=1900, minimum_hosts=0,
                                 request_volume=100) == []  # turned off
    same = {h: (90, 100) for h in "abcde"}
    assert success_rate_outliers(same, stdev_factor=0, **kw) == []  # no spread, no outlier


def test_success_rate_ejects_the_outlier_of_a_tier_each_interval() -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    router = router_for(6, clock, registry, zones=["a"] * 5 + ["b"], outlier_interval_s=10.0,
                        success_rate_request_volume=20, consecutive_5xx=0,
                        consecutive_gateway_failure=0)
    *near, far = router.states
    bad = near[4]
    for state in near[:4]:
        finish(router, state, "ok", 30)
    finish(router, bad, "ok", 15)
    finish(router, bad, "error", 15)  # 50% where its peers have 100%
    finish(router, far, "error", 30)  # alone in its tier: no peers, no verdict
    assert bad.available(clock())
    clock.now += 10.0
    finish(router, near[0], "ok")  # the next call to finish runs the due check
    assert not bad.available(clock())
    assert far.available(clock())
    assert ejections(registry, bad, "success_rate") == 1
    assert all(s.interval_calls == 0 for s in router.states)  # a new interval began

    # Too few calls in the next interval: nothing is judged.
    clock.now += bad.ejected_until - clock.now
    finish(router, bad, "error", 5)
    clock.now += 10.0
    router.refresh_gauges()  # the health checks' round runs a due check too
    assert bad.available(clock())


def test_consecutive_5xx_and_gateway_failures_count_as_envoy_counts_them() -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    router = router_for(3, clock, registry, consecutive_5xx=4, consecutive_gateway_failure=3,
                        max_ejected_percent=100)
    a, b, c = router.states
    finish(router, a, "gateway_error", 2)  # 502/504 answers
    finish(router, a, "error")  # a 500 breaks the gateway-failure run, not the 5xx one
    assert (a.consecutive_gateway_failures, a.consecutive_5xx) == (0, 3)
    finish(router, a, "conn_error")
    assert not a.available(clock())
    assert ejections(registry, a, "consecutive_5xx") == 1

    finish(router, b, "timeout", 2)
    finish(router, b, "gateway_error")
    assert not b.available(clock())
    assert ejections(registry, b, "consecutive_gateway_failure") == 1

    finish(router, c, "overloaded", 10)  # a 503 is backpressure: neither count moves
    finish(router, c, "cancelled", 10)
    assert (c.consecutive_gateway_failures, c.consecutive_5xx) == (0, 0)
    assert c.available(clock())


def test_ejection_time_doubles_on_repeat_and_the_max_share_holds_for_every_cause() -> None:
    clock = FakeClock()
    router = router_for(4, clock, consecutive_5xx=2, base_ejection_s=1.0, max_ejection_s=3.0,
                        max_ejected_percent=50)
    a, b, c, d = router.states
    finish(router, a, "error", 2)
    assert a.ejected_until == pytest.approx(clock() + 1.0)
    clock.now += 1.0
    finish(router, a, "error", 2)
    assert a.ejected_until == pytest.approx(clock() + 2.0)
    clock.now += 2.0
    finish(router, a, "error", 2)
    assert a.ejected_until == pytest.approx(clock() + 3.0)  # capped
    finish(router, b, "gateway_error", 3)
    finish(router, c, "error", 2)  # a third of four would pass the 50% share
    assert sum(not s.available(clock()) for s in router.states) == 2
    assert c.available(clock()) and d.available(clock())


def test_disabled_detectors_eject_nothing() -> None:
    clock = FakeClock()
    router = router_for(2, clock, consecutive_5xx=0, consecutive_gateway_failure=0)
    finish(router, router.states[0], "conn_error", 50)
    assert router.states[0].available(clock())


def test_success_rate_respects_the_max_ejected_share() -> None:
    clock = FakeClock()
    # Six hosts at 100%, two at 0%: mean 75, stdev 43.3, one stdev below the mean is 31.7.
    router = router_for(8, clock, success_rate_request_volume=10, success_rate_stdev_factor=1000,
                        max_ejected_percent=25, consecutive_5xx=0, consecutive_gateway_failure=0)
    *good, bad1, bad2 = router.states
    for state in good:
        finish(router, state, "ok", 10)
    finish(router, bad1, "error", 10)
    finish(router, bad2, "error", 10)
    assert router.check_success_rates() == [bad1, bad2]  # both outliers, 25% of eight

    router = router_for(8, clock, success_rate_request_volume=10, success_rate_stdev_factor=1000,
                        max_ejected_percent=20, consecutive_5xx=0, consecutive_gateway_failure=0)
    *good, bad1, bad2 = router.states
    for state in good:
        finish(router, state, "ok", 10)
    finish(router, bad1, "error", 10)
    finish(router, bad2, "error", 10)
    assert router.check_success_rates() == [bad1]  # 20% of eight is one
