"""Router: locality tiers, power-of-two-choices, passive ejection and model versions."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.routing import BackendSpec, BackendState, Router, RoutingSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver


class FakeClock:
    """A clock the test moves by hand (ejection times are minutes in real life)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def spec(port: int, zone: str = "a", region: str = "r1") -> BackendSpec:
    return BackendSpec(url=f"http://127.0.0.1:{port}", zone=zone, region=region)


def router_for(specs: list[BackendSpec], clock: FakeClock | None = None, seed: int = 7,
               metrics: GatewayMetrics | None = None, **settings: Any) -> Router:
    return Router(specs, RoutingSettings(region="r1", zone="a", **settings),
                  clock=clock or FakeClock(), rng=random.Random(seed),
                  observer=MetricsObserver(metrics) if metrics is not None else None)


def fail(router: Router, state: BackendState, times: int, outcome: str = "conn_error") -> None:
    for _ in range(times):
        router.on_start(state)
        router.on_finish(state, latency_s=0.001, outcome=outcome)  # type: ignore[arg-type]


def test_router_rejects_empty_and_duplicate_backends() -> None:
    with pytest.raises(ValueError, match="backends"):
        Router([], RoutingSettings())
    with pytest.raises(ValueError, match="duplicate"):
        Router([spec(1), spec(1)], RoutingSettings())


def test_tiers_are_zone_then_region_then_remote() -> None:
    router = router_for([spec(3, "x", "r2"), spec(2, "b"), spec(1, "a")])
    tiers = router.tiers()
    assert [name for name, _ in tiers] == ["zone", "region", "remote"]
    assert [[s.spec.zone for s in members] for _, members in tiers] == [["a"], ["b"], ["x"]]
    for name, members in tiers:
        assert all(router.tier_of(s) == name for s in members)


def test_pick_fails_over_tier_by_tier_when_near_tiers_are_unhealthy() -> None:
    router = router_for([spec(1, "a"), spec(2, "a"), spec(3, "b"), spec(4, "x", "r2")])
    (_, zone), (_, region), (_, remote) = router.tiers()
    assert all(router.pick() in zone for _ in range(50))
    for state in zone:
        router.set_health(state, False)
    assert all(router.pick() is region[0] for _ in range(20))
    router.set_health(region[0], False)
    assert router.pick() is remote[0]
    assert router.ready()
    router.set_health(remote[0], False)
    assert router.pick() is None
    assert not router.ready()
    router.set_health(zone[1], True)
    assert router.pick() is zone[1]


def test_pick_honours_exclude_and_tier_restriction() -> None:
    router = router_for([spec(1, "a"), spec(2, "b")])
    (_, [near]), (_, [far]) = router.tiers()
    assert router.pick(exclude=[near]) is far
    assert router.pick(exclude=[near, far]) is None
    assert router.pick(tiers={"region"}) is far
    assert router.pick(exclude=[far], tiers={"region"}) is None


def test_saturated_backend_fails_over_to_next_tier() -> None:
    router = router_for([spec(1, "a"), spec(2, "b")], max_inflight_per_backend=2)
    (_, [near]), (_, [far]) = router.tiers()
    router.on_start(near)
    assert router.pick() is near
    router.on_start(near)
    assert router.pick() is far
    router.on_finish(near, latency_s=0.01, outcome="ok")
    assert router.pick() is near


def test_p2c_prefers_less_loaded_backends() -> None:
    router = router_for([spec(p) for p in range(1, 5)])
    states = list(router.states)
    for load, state in enumerate(states):
        state.inflight = load
        state.ewma_s, state.samples = 0.01, 1
    counts = collections.Counter(router.pick() for _ in range(2000))
    shares = [counts[s] for s in states]
    assert shares[0] > shares[1] > shares[2] > shares[3]
    assert shares[3] == 0  # the most loaded never wins a pair
    assert shares[0] > 900  # it wins every pair it is in: half of all pairs


def test_p2c_gives_a_slow_backend_a_smaller_share() -> None:
    router = router_for([spec(1), spec(2), spec(3)], seed=3)
    fast_a, fast_b, slow = router.states
    latency = {fast_a: 0.01, fast_b: 0.01, slow: 0.08}
    inflight: collections.deque[BackendState] = collections.deque()
    counts: collections.Counter[BackendState] = collections.Counter()
    for _ in range(3000):  # a closed loop: 12 calls in flight, the oldest finishes first
        state = router.pick()
        assert state is not None
        router.on_start(state)
        counts[state] += 1
        inflight.append(state)
        if len(inflight) >= 12:
            done = inflight.popleft()
            router.on_finish(done, latency_s=latency[done], outcome="ok")
    assert counts[slow] < 0.2 * 3000
    assert counts[fast_a] > 0.35 * 3000 and counts[fast_b] > 0.35 * 3000


def test_unobserved_backend_compares_on_load_not_as_free() -> None:
    router = router_for([spec(1), spec(2)])
    seen, fresh = router.states
    router.on_start(seen)
    router.on_finish(seen, latency_s=0.05, outcome="ok")
    fresh.inflight = 3  # e.g. a new backend whose first calls hang
    assert all(router.pick() is seen for _ in range(20))


def test_ejection_after_consecutive_gateway_failures_doubles_and_caps() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    router = router_for([spec(1), spec(2), spec(3)], clock, metrics=metrics,
                        consecutive_gateway_failure=3, base_ejection_s=2.0,
                        max_ejection_s=5.0)
    bad = router.states[0]
    fail(router, bad, 2)
    router.on_start(bad)
    router.on_finish(bad, latency_s=0.01, outcome="ok")  # a success resets the count
    fail(router, bad, 2)
    assert bad.available(clock())
    fail(router, bad, 1)
    assert not bad.available(clock())
    assert bad.ejected_until == pytest.approx(clock() + 2.0)
    assert all(router.pick() is not bad for _ in range(30))
    labels = {"backend": bad.name, "zone": "a"}
    assert registry.get_sample_value("gateway_backend_healthy", labels) == 0.0
    assert registry.get_sample_value(
        "gateway_backend_ejections_total",
        {"backend": bad.name, "cause": "consecutive_gateway_failure"}) == 1.0

    clock.now += 2.0
    assert bad.available(clock())
    router.refresh_gauges()
    assert registry.get_sample_value("gateway_backend_healthy", labels) == 1.0
    fail(router, bad, 3)
    assert bad.ejected_until == pytest.approx(clock() + 4.0)  # doubled
    clock.now += 4.0
    fail(router, bad, 3)
    assert bad.ejected_until == pytest.approx(clock() + 5.0)  # capped
    assert bad.ejections == 3
    clock.now += 5.0 + 5.0 + 0.1  # in for a full max_ejection_s: the doubling starts over
    fail(router, bad, 3)
    assert bad.ejected_until == pytest.approx(clock() + 2.0)


def test_never_ejects_past_max_percent_nor_the_last_backend() -> None:
    clock = FakeClock()
    four = router_for([spec(p) for p in range(1, 5)], clock, max_ejected_percent=50)
    for state in four.states:
        fail(four, state, 3)
    assert sum(1 for s in four.states if not s.available(clock())) == 2

    two = router_for([spec(1), spec(2)], clock, max_ejected_percent=100)
    for state in two.states:
        fail(two, state, 5)
    assert sum(1 for s in two.states if s.available(clock())) == 1

    one = router_for([spec(1)], clock, max_ejected_percent=100)
    fail(one, one.states[0], 10)
    assert one.pick() is one.states[0]

    # Nor the last *available* one, when the other is down by health checks.
    pair = router_for([spec(1), spec(2)], clock, max_ejected_percent=100)
    pair.set_health(pair.states[1], False)
    fail(pair, pair.states[0], 5)
    assert pair.pick() is pair.states[0]


def test_overload_and_cancellation_do_not_count_toward_ejection() -> None:
    clock = FakeClock()
    router = router_for([spec(1), spec(2)], clock, consecutive_gateway_failure=2,
                        consecutive_5xx=2)
    state = router.states[0]
    fail(router, state, 5, "overloaded")
    fail(router, state, 5, "cancelled")
    assert state.consecutive_gateway_failures == state.consecutive_5xx == 0
    assert state.available(clock())
    assert state.inflight == 0


def test_failures_raise_the_ewma_so_fast_failures_do_not_attract_traffic() -> None:
    router = router_for([spec(1), spec(2)])
    state = router.states[0]
    router.on_start(state)
    router.on_finish(state, latency_s=0.02, outcome="ok")
    fail(router, state, 1, "error")
    assert state.ewma_s > 0.02
    before = state.ewma_s
    router.on_start(state)
    router.on_finish(state, latency_s=before / 2, outcome="cancelled")
    assert state.ewma_s == before  # a cancelled call says only "at least this long"
    router.on_start(state)
    router.on_finish(state, latency_s=before * 10, outcome="cancelled")
    assert state.ewma_s > before


def test_model_version_is_most_common_then_highest_among_healthy() -> None:
    router = router_for([spec(1), spec(2), spec(3)])
    a, b, c = router.states
    assert router.model_version("minilm") is None
    router.set_model_versions(a, {"minilm": "9"})
    router.set_model_versions(b, {"minilm": "10"})
    assert router.model_version("minilm") == "10"  # tie: numerically highest
    router.set_model_versions(c, {"minilm": "9"})
    assert router.model_version("minilm") == "9"  # most common
    router.set_health(a, False)
    router.set_health(c, False)
    assert router.model_version("minilm") == "10"  # only healthy backends count
    router.set_health(b, False)
    assert router.model_version("minilm") == "9"  # nothing healthy: every report counts
    assert router.model_version("other") is None


def test_model_identity_is_the_graph_behind_the_version_in_use() -> None:
    router = router_for([spec(1), spec(2), spec(3)])
    a, b, c = router.states
    assert router.model_identity("minilm") == ""  # nothing reported: name and version only
    router.set_model_versions(a, {"minilm": "1"}, {"minilm": "aa"})
    router.set_model_versions(b, {"minilm": "1"})  # a backend that reports no identity
    assert router.model_identity("minilm") == "aa"
    router.set_model_versions(c, {"minilm": "2"}, {"minilm": "cc"})
    router.set_model_versions(b, {"minilm": "2"}, {"minilm": "bb"})
    assert router.model_version("minilm") == "2"
    assert router.model_identity("minilm") in ("bb", "cc")  # the version in use, not "aa"
    router.set_model_versions(b, {"minilm": "2"}, {"minilm": "cc"})
    assert router.model_identity("minilm") == "cc"  # a changed report is seen at once
    router.set_health(b, False)
    router.set_health(c, False)
    assert router.model_identity("minilm") == "aa"  # only healthy backends count
