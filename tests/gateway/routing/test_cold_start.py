"""A backend's cold start as the gateway records it (gateway/routing/coldstart.py): its first
answers after it becomes ready apart from steady state, in /metrics and the stats JSON."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.http.stats import Stats
from gateway.policy.store import PolicyStore
from gateway.routing import Router, RoutingSettings
from gateway.routing.coldstart import COLD_ANSWERS
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.gateway.conftest import GatewayFactory, metric_value
from tests.gateway.routing.oip_fake import FakeBackend
from tests.gateway.routing.test_routing_balancer import FakeClock, spec


def answers(registry: CollectorRegistry, phase: str) -> float:
    value = registry.get_sample_value("gateway_backend_answer_seconds_count",
                                      {"backend": "127.0.0.1:1", "zone": "a", "phase": phase})
    return value or 0.0


async def test_first_answers_after_ready_are_cold_then_steady() -> None:
    clock, metrics = FakeClock(), GatewayMetrics(CollectorRegistry())
    router = Router([spec(1)], RoutingSettings(region="r1", zone="a"), clock=clock,
                    observer=MetricsObserver(metrics))
    (state,) = router.states

    def answer(n: int) -> None:
        for _ in range(n):
            router.on_start(state)
            router.on_finish(state, latency_s=0.01, outcome="ok")

    answer(5)  # ready when the gateway started: nothing says it is cold
    assert answers(metrics.registry, "steady") == 5 and answers(metrics.registry, "cold") == 0
    router.set_health(state, False)
    router.set_health(state, True)  # a restart: ready again
    clock.now += 2.5
    router.on_start(state)
    router.on_finish(state, latency_s=0.5, outcome="timeout")  # failures are not answers
    answer(1)
    assert state.cold_start.first_answer_after_s == 2.5
    answer(COLD_ANSWERS + 9)
    assert answers(metrics.registry, "cold") == COLD_ANSWERS
    assert answers(metrics.registry, "steady") == 5 + 10
    labels = {"backend": "127.0.0.1:1", "zone": "a"}
    assert metrics.registry.get_sample_value("gateway_backend_readies", labels) == 1
    store = PolicyStore([])
    await store.reload()
    snap = Stats(metrics.registry, router=router, policies=store).snapshot()
    (backend,) = snap["backends"]
    cold = backend["cold_start"]
    assert (cold["readies"], cold["cold"], cold["cold_answers"]) == (1, False, COLD_ANSWERS)
    assert cold["first_answer_after_ready_s"] == 2.5 and cold["ready_for_s"] == 2.5
    assert cold["latency_s"]["cold"]["p50"] is not None
    assert cold["latency_s"]["steady"]["p50"] is not None
    assert snap["cold_starts"] == {"backends_cold": 0, "readies": 1}


async def wait_for(check: Any, what: str) -> None:
    for _ in range(200):  # bounded: 10 s
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_a_restarted_backend_is_cold_again_in_the_stats(gateway: GatewayFactory) -> None:
    fake = FakeBackend()
    fake.ready = False  # starting: warming up
    await fake.start()
    try:
        client = await gateway(backends=[fake.url], **{"routing.health_interval_s": 0.1})

        async def stats() -> dict[str, Any]:
            snap: dict[str, Any] = await (await client.get("/dashboard/stats.json")).json()
            return snap

        async def cold_after(readies: int) -> bool:
            return (await stats())["cold_starts"] == {"backends_cold": 1, "readies": readies}

        async def send(n: int) -> None:
            for i in range(n):
                response = await client.post(
                    "/v1/embeddings", json={"model": "minilm", "input": f"cold {i}"},
                    headers={"Cache-Control": "no-store"})
                assert response.status == 200, await response.text()

        fake.ready = True
        await wait_for(lambda: cold_after(1), "ready after warming up")
        await send(3)
        (backend,) = (await stats())["backends"]
        cold = backend["cold_start"]
        assert cold["cold_answers"] == 3 and cold["first_answer_after_ready_s"] is not None
        assert cold["latency_s"]["cold"]["p50"] is not None
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, "gateway_backend_answer_seconds_count", phase="cold") == 3
        assert metric_value(text, "gateway_backend_answer_seconds_count", phase="steady") == 0

        await fake.stop()  # a restart: gone, then back on the same port
        await wait_for(lambda: _unhealthy(stats), "the stopped backend seen down")
        await fake.start()
        await wait_for(lambda: cold_after(2), "ready again after the restart")
        (backend,) = (await stats())["backends"]
        assert backend["cold_start"]["cold_answers"] == 0
        assert backend["cold_start"]["first_answer_after_ready_s"] is None
        await send(2)
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, "gateway_backend_answer_seconds_count", phase="cold") == 5
        assert metric_value(text, "gateway_backend_readies") == 2
    finally:
        await fake.stop()


async def _unhealthy(stats: Any) -> bool:
    (backend,) = (await stats())["backends"]
    return not backend["healthy"]
