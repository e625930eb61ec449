"""A request's deadline counts from when its head was read off the connection, not from when
its handler ran (issue 23, the deadline burst): the connection's protocol stamps every head
(``ARRIVED``), in order, and ``make_context`` counts the deadline from that stamp.

Pipelined requests on one socket stand for a burst: their heads are read in one turn, and the
second's handler starts only after the first's answer (aiohttp runs one handler at a time per
connection), as the last of a burst's handlers starts after the others. Assertions are on
order (the stamp is before the first handler finished), never on durations.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from gateway.http import app_state as state
from gateway.http.middleware import ARRIVED
from gateway.http.serve import make_context
from gateway.server import GatewayRunner
from gateway.settings import load_settings
from tests.gateway.rawhttp import read_reply


class _Server(TestServer):
    async def _make_runner(self, **kwargs: Any) -> GatewayRunner:
        return GatewayRunner(self.app, **kwargs)


async def test_each_pipelined_head_is_stamped_when_read_not_when_handled() -> None:
    marks: dict[str, float] = {}
    release, started = asyncio.Event(), asyncio.Event()

    async def first(request: web.Request) -> web.Response:
        marks["first arrived"] = request[ARRIVED]
        started.set()
        await release.wait()  # the second request's head is read meanwhile; its handler waits
        marks["first done"] = time.monotonic()
        return web.json_response({})

    async def second(request: web.Request) -> web.Response:
        marks["second handled"] = time.monotonic()
        marks["second arrived"] = request[ARRIVED]
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/first", first)
    app.router.add_get("/second", second)
    server = _Server(app)
    await server.start_server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            await started.wait()
            await asyncio.sleep(0.05)  # the first handler holds the connection
            release.set()
            assert (await read_reply(reader)).status == 200
            assert (await read_reply(reader)).status == 200
        writer.close()
    finally:
        await server.close()
    assert marks["first arrived"] <= marks["second arrived"]
    # The second's stamp is from when its head was read: before the first handler finished,
    # which is before the second handler ran.
    assert marks["second arrived"] < marks["first done"] <= marks["second handled"]


def test_the_deadline_counts_from_the_stamp() -> None:
    settings = load_settings(None, {"default_timeout_ms": 1000}, environ={})
    app = web.Application()
    app[state.SETTINGS] = settings
    earlier = time.monotonic() - 0.4
    request = make_mocked_request("POST", "/v1/embeddings", app=app,
                                  headers={"X-Request-Timeout-Ms": "600"})
    request[ARRIVED] = earlier
    ctx = make_context(request, "embeddings", tenant="public")
    assert ctx.deadline == earlier + 0.6  # 0.2 s left, not 0.6
    unstamped = make_mocked_request("POST", "/v1/embeddings", app=app)
    before = time.monotonic()
    ctx = make_context(unstamped, "embeddings", tenant="public")
    assert before + 1.0 <= ctx.deadline <= time.monotonic() + 1.0  # no stamp: from now


async def _stamps_after_a_busy_loop(headers: bytes) -> tuple[float, float, float]:
    """A request written while the loop is blocked for 0.3 s (its bytes wait in the socket):
    (written, read after the block, the request's stamp)."""
    stamps: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        stamps.append(request[ARRIVED])
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/", handler)
    server = _Server(app)
    await server.start_server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        written = time.monotonic()
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        await writer.drain()
        time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is busy, the head waits in the socket)
        unblocked = time.monotonic()
        async with asyncio.timeout(10):
            assert (await read_reply(reader)).status == 200
        writer.close()
    finally:
        await server.close()
    return written, unblocked, stamps[0]


async def test_a_head_with_its_own_deadline_is_stamped_when_it_reached_the_socket() -> None:
    written, unblocked, stamp = await _stamps_after_a_busy_loop(b"X-Request-Timeout-Ms: 600\r\n")
    # The kernel's reading moves the stamp back by the 0.3 s the bytes waited (to within its
    # tick of 1-10 ms), not to the read after the block.
    assert written - 0.05 <= stamp < unblocked - 0.2


async def test_a_head_without_a_deadline_is_stamped_when_read() -> None:
    _, unblocked, stamp = await _stamps_after_a_busy_loop(b"")
    assert stamp >= unblocked
