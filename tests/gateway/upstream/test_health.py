"""HealthChecker against real loopback servers that stop, start, stall and change versions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.upstream.health import HealthChecker
from tests.gateway.routing.oip_fake import FakeBackend

MODELS = ("minilm",)  # the models whose versions the checker reads


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def setup(backends: list[FakeBackend], **overrides: Any) -> tuple[Router, RoutingSettings]:
    values: dict[str, Any] = {"health_timeout_s": 0.3, "health_interval_s": 0.05}
    values.update(overrides)
    settings = RoutingSettings(**values)
    specs = [BackendSpec(url=b.url) for b in backends]
    return Router(specs, settings), settings


async def test_backend_that_stops_and_starts_on_a_fixed_port_flips_health(
    session: aiohttp.ClientSession,
) -> None:
    backend = FakeBackend()
    other = FakeBackend()
    async with backend, other:
        # Nothing here waits out a timeout (a stopped port refuses at once): a generous one
        # keeps a loaded machine from failing the healthy probes (0.3 s flaked in a full run).
        router, settings = setup([backend, other], health_timeout_s=5.0)
        checker = HealthChecker(router, session, settings, models=MODELS)
        await checker.check_once()
        state = router.states[0]
        assert state.healthy and state.model_versions == {"minilm": "1"}

        await backend.stop()  # refused: unhealthy at once, no threshold
        await checker.check_once()
        if state.healthy:  # the first probe may land on a pooled connection the server closed
            await checker.check_once()
        assert not state.healthy
        assert router.pick() is router.states[1]

        await backend.start()  # same port again
        await checker.check_once()
        assert state.healthy
        assert router.ready()


async def test_not_ready_is_unhealthy_at_once_and_timeouts_need_the_threshold(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeBackend() as backend:
        router, settings = setup([backend], unhealthy_threshold=2, health_timeout_s=0.1)
        checker = HealthChecker(router, session, settings, models=MODELS)
        state = router.states[0]
        backend.ready = False
        await checker.check_once()
        assert not state.healthy and not router.ready()
        backend.ready = True
        await checker.check_once()
        assert state.healthy

        backend.health_delay_s = 0.5  # stalls past health_timeout_s
        await checker.check_once()
        assert state.healthy  # one slow probe is not enough
        await checker.check_once()
        assert not state.healthy
        backend.health_delay_s = 0.0
        await checker.check_once()
        assert state.healthy


async def test_version_change_is_picked_up_and_reported(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeBackend(version="1") as backend:
        router, settings = setup([backend])
        changes: list[tuple[str, str | None, str]] = []
        checker = HealthChecker(router, session, settings, models=("minilm", "absent"),
                                on_version_change=lambda *c: changes.append(c))
        await checker.check_once()
        assert router.model_version("minilm") == "1"
        assert router.model_version("absent") is None
        assert changes == [("minilm", None, "1")]

        backend.version = "2"
        await checker.check_once()
        assert router.model_version("minilm") == "2"
        assert changes[-1] == ("minilm", "1", "2")
        await checker.check_once()
        assert len(changes) == 2  # no change, no callback


async def test_health_success_does_not_cut_an_ejection_short(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeBackend() as a, FakeBackend() as b:
        router, settings = setup([a, b], consecutive_5xx=1, base_ejection_s=30.0)
        checker = HealthChecker(router, session, settings, models=MODELS)
        state = router.states[0]
        router.on_start(state)
        router.on_finish(state, latency_s=0.01, outcome="error")
        assert not state.available(router.now())
        await checker.check_once()
        assert state.healthy
        assert not state.available(router.now())


async def test_background_loop_notices_a_dying_backend_and_stops_cleanly(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeBackend() as backend, FakeBackend() as other:
        router, settings = setup([backend, other])
        checker = HealthChecker(router, session, settings, models=MODELS)
        await checker.start()
        state = router.states[0]
        assert state.healthy and state.model_versions
        await backend.stop()
        for _ in range(100):  # bounded: 100 x 20 ms
            if not state.healthy:
                break
            await asyncio.sleep(0.02)
        assert not state.healthy
        await backend.start()
        for _ in range(100):
            if state.healthy:
                break
            await asyncio.sleep(0.02)
        assert state.healthy
        await checker.stop()
        polled = backend.health_requests
        await asyncio.sleep(0.2)
        assert backend.health_requests == polled  # no task left behind
