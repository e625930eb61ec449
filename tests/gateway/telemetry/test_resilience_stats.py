"""The resilience numbers on /dashboard: retries by reason, budget refusals, ejections by cause,
backends in slow start, from the metrics the upstream client and the router report."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.http.stats import Stats
from gateway.policy.store import PolicyStore
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.gateway.routing.test_routing_balancer import FakeClock


async def test_snapshot_reports_retries_refusals_ejections_and_slow_start() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    observer = MetricsObserver(metrics)
    clock = FakeClock()
    router = Router([BackendSpec(url="http://a:1", zone="a"), BackendSpec(url="http://b:1",
                                                                         zone="a")],
                    RoutingSettings(zone="a", slow_start_window_s=10.0,
                                    consecutive_gateway_failure=1),
                    observer=observer, clock=clock)
    a, b = router.states
    for reason in ("http_502", "http_502", "per_try_timeout"):
        observer.retry(reason)
    observer.retry_overflow("http_503")
    router.on_start(a)
    router.on_finish(a, latency_s=0.01, outcome="conn_error")  # ejected: 1 gateway failure
    router.set_health(b, False)
    router.set_health(b, True)  # back: slow start
    clock.now += 5.0
    store = PolicyStore([])
    await store.reload()
    snap = Stats(metrics.registry, router=router, policies=store).snapshot()
    assert snap["resilience"] == {
        "retries": {"total": 3.0, "by_reason": {"http_502": 2.0, "per_try_timeout": 1.0}},
        "budget_refused": {"total": 1.0, "by_reason": {"http_503": 1.0}},
        "ejections": {"total": 1.0, "by_cause": {"consecutive_gateway_failure": 1.0}},
        "slow_start": 2,  # both: one back from its 2 s ejection, one healthy again
    }
    first, second = snap["backends"]
    assert first["slow_start"] and first["weight"] == 0.3 and not first["ejected"]
    assert second["slow_start"] and second["weight"] == 0.5
    clock.now += 10.0
    snap = Stats(metrics.registry, router=router, policies=store).snapshot()
    assert snap["resilience"]["slow_start"] == 0
    assert [b["weight"] for b in snap["backends"]] == [1.0, 1.0]
