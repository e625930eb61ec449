"""Shared rig for tests of ``Upstream``: a wired router, admission and client session in front
of fake OIP backends on loopback (tests/gateway/routing/oip_fake.py).

The fixtures ``build`` and ``fakes`` live here and are registered in tests/gateway/conftest.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.admission import Admission, AdmissionSettings
from gateway.metrics import GatewayMetrics
from gateway.observe import MetricsObserver
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.upstream import AiohttpTransport, InferResult, Upstream
from tests.gateway.routing.oip_fake import FakeBackend


@dataclass
class Rig:
    upstream: Upstream
    router: Router
    admission: Admission
    settings: RoutingSettings
    registry: CollectorRegistry
    transport: AiohttpTransport

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def embed(self, texts: list[str] | None = None, timeout_s: float = 5.0,
                    rid: str = "req-1") -> InferResult:
        return await self.upstream.infer_texts(
            "minilm", texts or ["hello"], request_id=rid, deadline=time.monotonic() + timeout_s)


Build = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def build() -> AsyncIterator[Build]:
    """Factory: ``await build([(fake, zone), ...], **settings)`` -> a wired Upstream; settings
    are fields of ``RoutingSettings`` or of ``AdmissionSettings``."""
    cleanups: list[Callable[[], Awaitable[None]]] = []
    admission_fields = {f.name for f in dataclasses.fields(AdmissionSettings)}

    async def make(backends: list[tuple[FakeBackend, str]], **overrides: Any) -> Rig:
        values: dict[str, Any] = {"region": "r1", "zone": "a", "connect_timeout_s": 0.5}
        values.update({k: v for k, v in overrides.items() if k not in admission_fields})
        settings = RoutingSettings(**values)
        admission_settings = AdmissionSettings(
            **{k: v for k, v in overrides.items() if k in admission_fields})
        registry = CollectorRegistry()
        metrics = GatewayMetrics(registry)
        specs = [BackendSpec(url=b.url, zone=z, region="r1") for b, z in backends]
        observer = MetricsObserver(metrics)
        router = Router(specs, settings, observer=observer)
        admission = Admission(admission_settings, observer=observer)
        transport = AiohttpTransport.create(pool_size=settings.pool_size,
                                            connect_timeout_s=settings.connect_timeout_s)
        cleanups.append(transport.close)
        upstream = Upstream(transport, router, admission, settings,
                            observer=observer)
        return Rig(upstream, router, admission, settings, registry, transport)

    yield make
    for cleanup in cleanups:
        await cleanup()


@pytest.fixture
async def fakes() -> AsyncIterator[Callable[..., Awaitable[FakeBackend]]]:
    """Factory for started fake backends, all stopped at the end."""
    made: list[FakeBackend] = []

    async def make(start: bool = True, **kwargs: Any) -> FakeBackend:
        backend = FakeBackend(**kwargs)
        made.append(backend)
        if start:
            await backend.start()
        return backend

    yield make
    for backend in made:
        await backend.stop()
