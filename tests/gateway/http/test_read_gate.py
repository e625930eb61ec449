"""Refusals judged as the head is read (gateway/http/gate.py, issue 23's overload target): while
a tenant's calls queue past its wait bound, its next complete request on an idle keep-alive
connection is answered by the connection's protocol with the app's own refusal, before aiohttp
builds a request, and held as the app holds it; everything else takes the full path.

The real app through ``GatewayRunner`` on a socket, raw HTTP/1.1 on the wire, a fake backend,
and the test's own slot holders and waiters in admission (as test_early_refusal_http.py), so
that the tier's state is exact. Whether the app ran is seen by a spy on the cached routes'
``serve``; assertions are on statuses, order and counts (a hold's lower bound is the one time
check: asyncio timers never fire early)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http import app_state as state
from gateway.http.gate import CachedRoutes
from gateway.http.routes import cached
from gateway.server import GatewayRunner
from gateway.settings import load_settings
from gateway.tenants.directory import Tenants, key_digest
from gateway.upstream.admission.slots import Slot
from tests.gateway.rawhttp import Reply, read_reply
from tests.gateway.routing.oip_fake import FakeBackend

A_KEY, B_KEY = "read-gate-key-a-000001", "read-gate-key-b-000001"


class _Server(TestServer):
    """Served as ``python -m gateway serve`` serves: ``GatewayRunner``, the idle timeout of
    ``connections.keepalive_timeout_s``."""

    async def _make_runner(self, **kwargs: Any) -> GatewayRunner:
        idle = self.app[state.SETTINGS].connections.keepalive_timeout_s
        return GatewayRunner(self.app, keepalive_timeout=idle, **kwargs)


class Rig:
    """The served app, what reached the app's cached routes, and tenant a's backlog."""

    def __init__(self, app: web.Application, server: _Server) -> None:
        self.app = app
        self.server = server
        self.served: list[str] = []  # the tenant key of every request the app's route ran for

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.server.port)

    async def metrics(self) -> str:
        reader, writer = await self.connect()
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = await read_reply(reader)
        writer.close()
        return reply.body.decode()


def request(key: str | None, text: str, *, path: str = "/v1/embeddings",
            extra: str = "", version: str = "1.1", ctype: str = "application/json") -> bytes:
    """One complete POST with a JSON body (keep-alive unless ``extra`` says otherwise)."""
    body = orjson.dumps({"model": "minilm", "input": [text]})
    auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: {ctype}\r\n{auth}"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n{extra}\r\n"
            ).encode() + body


@asynccontextmanager
async def rig_for(backend: FakeBackend, monkeypatch: pytest.MonkeyPatch,
                  **overrides: Any) -> AsyncIterator[Rig]:
    """The app served through ``GatewayRunner`` with tenants a and b; tenant a holds both slots
    and four waiters of a tier whose slot is held ~100 ms (so its next call would wait 250 ms,
    past the bound of 2 x 100 ms: refused for ``wait``)."""
    settings = load_settings(None, {
        "backends": [backend.url], "admission.tier_concurrency": 2,
        "admission.tier_queue": 50, "admission.max_wait_factor": 2,
        "admission.adaptive.enabled": False, "admission.refusal_hold_s": 0,
        "cache.node.enabled": False, "routing.health_interval_s": 0.5,
        "routing.retry": False, **overrides}, environ={})
    tenants = Tenants.from_mapping({"a": [key_digest(A_KEY)], "b": [key_digest(B_KEY)]})
    app = create_app(settings, registry=CollectorRegistry(), tenants=tenants)
    server = _Server(app)
    await server.start_server()
    rig = Rig(app, server)
    serve = cached.serve

    async def spy(request: web.Request, route: str, parse: Any) -> web.Response:
        rig.served.append(request.headers.get("Authorization", "")[-6:])
        return await serve(request, route, parse)

    monkeypatch.setattr(cached, "serve", spy)
    admission = app[state.ADMISSION]
    tier: str = app[state.ROUTER].tiers()[0][0]
    holders: list[Slot] = [await admission.acquire(tier, deadline=1e12, tenant="a")
                           for _ in range(2)]
    admission.observe(0.1, tier=tier)
    waiters = [asyncio.create_task(admission.acquire(tier, deadline=1e12, tenant="a"))
               for _ in range(4)]
    await asyncio.sleep(0)
    assert admission.backlogged
    try:
        yield rig
    finally:
        for slot in holders:
            slot.release()
        for task in waiters:
            (await task).release()
        await server.close()


async def exchange(rig: Rig, *payloads: bytes) -> list[Reply]:
    """Each payload written on one connection after the previous reply was read."""
    reader, writer = await rig.connect()
    replies = []
    for payload in payloads:
        writer.write(payload)
        replies.append(await read_reply(reader))
    writer.close()
    return replies


async def test_a_refused_request_is_answered_from_its_head_as_the_app_would(
        fakes: Callable[..., Awaitable[FakeBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    async with rig_for(await fakes(), monkeypatch) as rig:
        replies = await exchange(
            rig, request(A_KEY, "one", extra="X-Request-Id: client-id-1\r\n"),
            request(A_KEY, "two", path="/v2/models/minilm/infer"),
            request(B_KEY, "quiet"))  # the same connection, still open, then the app
        first, second, quiet = replies
        for reply in (first, second):
            assert reply.status == 503 and reply.headers.get("connection") != "close"
            error = reply.error()
            assert error["type"] == "overloaded"
            assert "exceeds 2 x the tier's service time" in error["message"]
            assert int(reply.headers["retry-after"]) >= 1
            assert reply.headers["server"] == "edge-gateway"
            assert reply.headers["x-request-id"] == error["request_id"]
        assert first.headers["x-request-id"] == "client-id-1"
        assert quiet.status == 200
        assert rig.served == [B_KEY[-6:]]  # the app ran for b alone
        # Many on one connection, then two in one segment: aiohttp's parser holds back what
        # follows a request once 32 are queued (as it counts them), so each one answered here
        # is handed back to it.
        reader, writer = await rig.connect()
        for i in range(40):
            writer.write(request(A_KEY, f"many {i}"))
            assert (await read_reply(reader)).status == 503
        writer.write(request(A_KEY, "pipelined") + request(B_KEY, "behind it"))
        assert [(await read_reply(reader)).status for _ in range(2)] == [503, 200]
        writer.close()
        assert rig.served == [B_KEY[-6:], A_KEY[-6:], B_KEY[-6:]]
        scraped = await rig.metrics()
        assert 'gateway_shed_total{reason="wait"} 43.0' in scraped
        assert 'gateway_tenant_requests_total{outcome="shed",tenant="a"} 43.0' in scraped
        assert ('gateway_requests_total{cache="NONE",route="/v1/embeddings",status="503"} 42.0'
                in scraped)
        assert ('gateway_requests_total{cache="NONE",route="/v2/models/{name}/infer",'
                'status="503"} 1.0' in scraped)


async def test_what_the_gate_leaves_to_the_app(
        fakes: Callable[..., Awaitable[FakeBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the app would answer otherwise (401, 400, 415) or what is not a complete
    keep-alive HTTP/1.1 request alone on its connection reaches the app, which refuses a's
    requests by the full path when it gets that far."""
    async with rig_for(await fakes(), monkeypatch) as rig:
        statuses = [reply.status for reply in await exchange(
            rig,
            request("no-such-key-000000", "k"),  # 401
            request(A_KEY, "k").replace(A_KEY.encode(), b"\xff\xfe-not-utf8"),  # 401
            request(A_KEY, "t", extra="X-Request-Timeout-Ms: soon\r\n"),  # 400
            request(A_KEY, "c", ctype="text/plain"),  # 415
            request(A_KEY, "two keys", extra=f"Authorization: Bearer {B_KEY}\r\n"),
            request(A_KEY, "v", version="1.0", extra="Connection: keep-alive\r\n"),  # HTTP/1.0
        )]
        assert statuses == [401, 401, 400, 415, 503, 503]
        assert len(rig.served) == 6
        # Connection: close: the app answers and closes.
        closing = await exchange(rig, request(A_KEY, "x", extra="Connection: close\r\n"))
        assert closing[0].status == 503 and len(rig.served) == 7
        # A body that comes after its head: the head is judged when the body is read, by the
        # app.
        reader, writer = await rig.connect()
        whole = request(A_KEY, "split")
        cut = whole.index(b"\r\n\r\n") + 4
        writer.write(whole[:cut])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(whole[cut:])
        assert (await read_reply(reader)).status == 503 and len(rig.served) == 8
        # Two requests in one segment (pipelined): both to the app, answered in order.
        writer.write(request(A_KEY, "p1") + request(B_KEY, "p2"))
        assert [(await read_reply(reader)).status for _ in range(2)] == [503, 200]
        assert len(rig.served) == 10
        writer.close()


async def test_a_held_refusal_is_written_after_its_hold_and_before_what_followed(
        fakes: Callable[..., Awaitable[FakeBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    hold_s = 0.2
    async with rig_for(await fakes(), monkeypatch, **{"admission.refusal_hold_s": hold_s}) as rig:
        reader, writer = await rig.connect()
        start = time.monotonic()
        writer.write(request(A_KEY, "held"))
        await writer.drain()
        await asyncio.sleep(0.05)  # the next request arrives while the refusal is held
        writer.write(request(B_KEY, "after"))
        first = await read_reply(reader)
        waited = time.monotonic() - start
        second = await read_reply(reader)
        assert (first.status, second.status) == (503, 200)
        assert waited >= hold_s - 0.01  # the hold's timer: never early (~0.01: clock steps)
        # The hold shortened Retry-After (its drain time here is under a second: 1 at least).
        assert first.headers["retry-after"] == "1"
        assert rig.served == [B_KEY[-6:]]
        # Bytes that reach the protocol while a refusal is held (reading is paused then, but a
        # transport may hand over one more segment) are answered after it, in order.
        writer.write(request(A_KEY, "held again"))
        await writer.drain()
        await asyncio.sleep(0.05)
        (protocol,) = rig.server.runner.server.connections  # type: ignore[union-attr]
        protocol.data_received(request(B_KEY, "handed over"))
        assert [(await read_reply(reader)).status for _ in range(2)] == [503, 200]
        assert rig.served == [B_KEY[-6:]] * 2
        # A client that goes away during a hold leaves the server as it was.
        writer.write(request(A_KEY, "gone"))
        await writer.drain()
        writer.close()
        await asyncio.sleep(hold_s + 0.1)
        replies = await exchange(rig, request(B_KEY, "still"))
        assert replies[0].status == 200


async def test_a_connection_stays_open_for_the_keepalive_timeout_after_a_refusal(
        fakes: Callable[..., Awaitable[FakeBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle timer counts from the last answer, refusals included: a client refused again
    and again keeps its connection, and an idle one is closed."""
    async with rig_for(await fakes(), monkeypatch,
                       **{"connections.keepalive_timeout_s": 0.5}) as rig:
        reader, writer = await rig.connect()
        for i in range(4):  # 4 x 0.2 s: past the timeout counted from the connection's start
            writer.write(request(A_KEY, f"again {i}"))
            assert (await read_reply(reader)).status == 503
            await asyncio.sleep(0.2)
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # then idle: closed by the server
        assert rig.served == []


async def test_with_refuse_at_read_off_every_request_reaches_the_app(
        fakes: Callable[..., Awaitable[FakeBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    async with rig_for(await fakes(), monkeypatch,
                       **{"admission.refuse_at_read": False}) as rig:
        replies = await exchange(rig, request(A_KEY, "one"), request(A_KEY, "two"))
        assert [r.status for r in replies] == [503, 503]
        assert rig.served == [A_KEY[-6:]] * 2


def test_the_cached_routes_a_target_names() -> None:
    route_of = CachedRoutes().route_of
    assert route_of("/v1/embeddings") == "/v1/embeddings"
    assert route_of("/v1/embeddings?x=1") == "/v1/embeddings"
    assert route_of("/v1/rank") == "/v1/rank"
    assert route_of("/v2/models/minilm/infer") == "/v2/models/{name}/infer"
    assert route_of("/v2/models/minilm/versions/1/infer") == (
        "/v2/models/{name}/versions/{version}/infer")
    for other in ("/v1/embeddings/", "/v1/embeddingsx", "/v2/models//infer",
                  "/v2/models/a/b/infer", "/v1/batches", "/metrics", "/v1/%65mbeddings"):
        assert route_of(other) is None, other
