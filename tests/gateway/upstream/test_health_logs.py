"""What the health checker logs: a backend still starting up is INFO, once; a failure is WARNING."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.upstream.health import HealthChecker
from tests.gateway.routing.oip_fake import FakeBackend, free_port

LOGGER = "gateway.upstream.health"
MODELS = ("minilm",)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str]]:
    """The health changes logged: (level, message, reason)."""
    return [(r.levelno, r.getMessage(), getattr(r, "reason", ""))
            for r in caplog.records if r.name == LOGGER and r.getMessage().startswith("backend")]


async def test_a_backend_warming_up_is_info_once_then_a_failure_is_a_warning(
    session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    backend = FakeBackend(port=free_port())
    settings = RoutingSettings(health_timeout_s=0.5, health_interval_s=0.05)
    router = Router([BackendSpec(url=backend.url)], settings)
    checker = HealthChecker(router, session, settings, models=MODELS)
    state = router.states[0]

    await checker.check_once()  # nothing listens yet: the backend is still loading its model
    async with backend:
        backend.ready = False  # listening, warming up: readiness answers 503
        await checker.check_once()
        await checker.check_once()
        assert not state.healthy and not router.ready()
        assert records(caplog) == [
            (logging.INFO, "backend not ready yet", "connection refused or unreachable")]

        caplog.clear()
        backend.ready = True
        await checker.check_once()
        assert state.healthy
        assert records(caplog) == [(logging.INFO, "backend healthy", "")]

        caplog.clear()
        backend.ready = False  # it was ready: now this is a failure
        await checker.check_once()
        await checker.check_once()
        assert not state.healthy
        assert records(caplog) == [
            (logging.WARNING, "backend unhealthy", "readiness answered HTTP 503")]


async def test_a_backend_that_dies_after_being_ready_is_a_warning(
    session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with FakeBackend() as backend:
        settings = RoutingSettings(health_timeout_s=0.5, health_interval_s=0.05)
        router = Router([BackendSpec(url=backend.url)], settings)
        checker = HealthChecker(router, session, settings, models=MODELS)
        await checker.check_once()
        assert router.states[0].healthy
        await backend.stop()
        await checker.check_once()
        if router.states[0].healthy:  # the probe may land on a pooled connection being closed
            await checker.check_once()
        assert not router.states[0].healthy
        assert [(level, msg) for level, msg, _ in records(caplog)] == [
            (logging.WARNING, "backend unhealthy")]


async def test_a_backend_never_ready_gets_no_threshold_for_timeouts(
    session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with FakeBackend() as backend:
        backend.health_delay_s = 0.5  # accepts, then stalls past health_timeout_s
        settings = RoutingSettings(health_timeout_s=0.1, health_interval_s=0.05,
                                   unhealthy_threshold=3)
        router = Router([BackendSpec(url=backend.url)], settings)
        checker = HealthChecker(router, session, settings, models=MODELS)
        await checker.check_once()
        assert not router.states[0].healthy and not router.ready()
        assert records(caplog) == [
            (logging.INFO, "backend not ready yet", "readiness check timed out")]
