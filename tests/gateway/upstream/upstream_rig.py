"""Shared rig for tests of ``Upstream``: a wired router, admission and client session in front
of fake OIP backends on loopback (tests/gateway/routing/oip_fake.py); and, for the resilience
tests, a real model server behind a real proxy process (``NearZone``) and steady load through a
gateway (``Load``).

The fixtures ``build`` and ``fakes`` live here and are registered in tests/gateway/conftest.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bench.fault_proxy import ProxyProc, start_proxy
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.upstream import AiohttpTransport, InferResult, Upstream
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.lean import LeanTransport
from gateway.upstream.transport import Transport
from tests.conftest import free_port
from tests.gateway.routing.oip_fake import FakeBackend

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default


@dataclass
class Rig:
    upstream: Upstream
    router: Router
    admission: Admission
    settings: RoutingSettings
    registry: CollectorRegistry
    transport: Transport
    """The client ``routing.http_client`` names, as the app chooses it."""

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
        # A fixed limit (tier_concurrency) unless a test passes ``adaptive``: these tests are
        # about routing and the queue, not about the limit moving.
        admission_settings = AdmissionSettings(**{"adaptive": FIXED, **{
            k: v for k, v in overrides.items() if k in admission_fields}})
        registry = CollectorRegistry()
        metrics = GatewayMetrics(registry)
        specs = [BackendSpec(url=b.url, zone=z, region="r1") for b, z in backends]
        observer = MetricsObserver(metrics)
        router = Router(specs, settings, observer=observer)
        admission = Admission(admission_settings, observer=observer)
        transport: Transport
        if settings.http_client == "lean":
            transport = LeanTransport(pool_size=settings.pool_size,
                                      connect_timeout_s=settings.connect_timeout_s)
        else:
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


# --- Real processes: a model server behind a fault proxy, and steady load through a gateway ---


@dataclass
class NearZone:
    """A real model server (``python -m backend serve``) behind a ``bench.fault_proxy`` process:
    the near zone as a deployment has it (a Service or sidecar in front of the model server).
    The model server can be killed, restarted on its port, frozen and thawed; the proxy stays."""

    models_dir: Path
    port: int
    backend: Any  # tests.gateway.conftest.BackendProc
    proxy: ProxyProc
    frozen: bool = False

    @property
    def url(self) -> str:
        """Where the gateway sends the near zone's traffic: the proxy."""
        return self.proxy.url

    def kill(self) -> None:
        """SIGKILL the model server: no goodbye, its connections reset."""
        self.thaw()
        self.backend.proc.kill()
        self.backend.proc.wait()

    def restart(self) -> None:
        """A new model server on the same port, ready (warmed up) on return."""
        from tests.gateway.conftest import start_backend

        self.backend = start_backend(self.models_dir, zone="zone-a", region="r1", port=self.port)

    def freeze(self) -> None:
        """SIGSTOP: it keeps its sockets (connections are accepted by the kernel) but never
        answers."""
        os.kill(self.backend.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            os.kill(self.backend.proc.pid, signal.SIGCONT)
            self.frozen = False

    def ensure_up(self) -> None:
        """Running, answering and without a fault, as the next test expects it."""
        self.thaw()
        self.proxy.fault(None)
        if self.backend.proc.poll() is not None:
            self.restart()

    def stop(self) -> None:
        from tests.gateway.conftest import stop_process

        try:
            self.thaw()
            stop_process(self.backend.proc)
        finally:
            self.proxy.stop()


def start_near_zone(models_dir: Path) -> NearZone:
    from tests.gateway.conftest import start_backend, stop_process

    port = free_port()
    backend = start_backend(models_dir, zone="zone-a", region="r1", port=port)
    try:
        proxy = start_proxy(backend.url, free_port())
    except BaseException:
        stop_process(backend.proc)
        raise
    return NearZone(models_dir, port, backend, proxy)


@dataclass
class Load:
    """Closed-loop load through a gateway: ``concurrency`` clients, each sending one
    ``/v1/embeddings`` request (a unique text, ``no-store``) after the other, until ``total``
    requests were sent or ``limit_s`` passed. Statuses and Retry-After headers are kept."""

    client: Any  # aiohttp TestClient
    total: int
    concurrency: int = 4
    limit_s: float = 60.0
    timeout_ms: int | None = None
    """Each request's deadline (``X-Request-Timeout-Ms``); the gateway's default when None."""
    statuses: list[int] = field(default_factory=list)
    retry_after: list[str | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """The bodies of the answers that were not 200."""
    started: int = 0

    @property
    def done(self) -> int:
        return len(self.statuses)

    def failures(self) -> list[int]:
        return [s for s in self.statuses if s != 200]

    async def run(self) -> None:
        end = time.monotonic() + self.limit_s

        async def client() -> None:
            while self.started < self.total and time.monotonic() < end:
                i = self.started
                self.started += 1
                headers = {"Cache-Control": "no-store"}
                if self.timeout_ms is not None:
                    headers["X-Request-Timeout-Ms"] = str(self.timeout_ms)
                resp = await self.client.post(
                    "/v1/embeddings", headers=headers,
                    json={"model": "minilm", "input": f"steady load {i} {time.monotonic()}"})
                body = await resp.read()
                if resp.status != 200:
                    self.errors.append(body[:300].decode(errors="replace"))
                self.retry_after.append(resp.headers.get("Retry-After"))
                self.statuses.append(resp.status)

        await asyncio.gather(*(client() for _ in range(self.concurrency)))

    async def until(self, done: int, limit_s: float = 60.0) -> None:
        """Wait (bounded) until ``done`` requests have their answers."""
        for _ in range(int(limit_s / 0.01)):
            if self.done >= done:
                break
            await asyncio.sleep(0.01)
        assert self.done >= done, f"only {self.done} of {done} requests answered"


async def gateway_metrics(client: Any) -> str:
    """The gateway's ``/metrics`` text."""
    resp = await client.get("/metrics")
    text: str = await resp.text()
    return text
