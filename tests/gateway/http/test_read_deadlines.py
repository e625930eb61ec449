"""Read deadlines, idle keep-alive and the connection cap (issue 20, item 5), over raw loopback
sockets against a real gateway process with short limits.

A client that sends one header line, or one body byte, every second is answered 408 and closed;
an idle keep-alive connection is closed; one connection over the cap is answered 503; and while
slow clients hold connections, healthy requests on other connections are answered (they finish
before any slow client's deadline has even passed: ordering, not timing). Every loop is bounded
by a count and every read by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest

from bench import services
from tests.gateway.conftest import BackendProc
from tests.gateway.rawhttp import Reply, head, read_reply

DEADLINE_S = 6.0  # header, body and keep-alive; generous for a loaded 2-core machine
CAP = 40
EMBED = {"model": "minilm", "input": "read deadlines"}
MAX_DRIBBLES = 60  # a line or byte a second: ten times the deadline, never reached when it holds


@pytest.fixture(scope="module")
def port(backend: BackendProc) -> Iterator[int]:
    settings = {"logging": {"level": "WARNING"},
                "connections": {"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S,
                                "keepalive_timeout_s": DEADLINE_S, "max_per_worker": CAP}}
    with services.gateway(backend.url, cores=None, name="read-deadlines",
                          settings=settings) as gw:
        yield gw.port


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                        asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def dribble(writer: asyncio.StreamWriter, pieces: list[bytes]) -> int:
    """Write one piece a second until the server closes; how many were written."""
    sent = 0
    for piece in pieces[:MAX_DRIBBLES]:
        if writer.is_closing():
            break
        try:
            writer.write(piece)
            await writer.drain()
        except OSError:
            break
        sent += 1
        await asyncio.sleep(1.0)
    return sent


async def answered_then_closed(reader: asyncio.StreamReader) -> Reply:
    reply = await read_reply(reader)
    async with asyncio.timeout(30):
        assert await reader.read() == b"", "the connection stayed open after the 408"
    return reply


async def test_a_head_sent_a_line_at_a_time_gets_408_and_is_closed(port: int) -> None:
    lines = [f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()]
    lines += [f"X-Filler-{i}: {i}\r\n".encode() for i in range(MAX_DRIBBLES)]
    async with connection(port) as (reader, writer):
        sender = asyncio.create_task(dribble(writer, lines))
        reply = await answered_then_closed(reader)
        sent = await sender
    assert reply.status == 408
    assert reply.error()["type"] == "request_timeout"
    assert reply.headers["connection"] == "close"
    assert sent < MAX_DRIBBLES


async def test_a_body_sent_a_byte_at_a_time_gets_408_and_is_closed(port: int) -> None:
    body = orjson.dumps(EMBED)
    async with connection(port) as (reader, writer):
        writer.write(head("/v1/embeddings", port, length=len(body)))
        sender = asyncio.create_task(dribble(writer, [bytes([b]) for b in body]))
        reply = await answered_then_closed(reader)
        sent = await sender
    assert reply.status == 408, reply
    assert reply.error()["type"] == "request_timeout"
    assert sent < len(body)


async def test_an_idle_keepalive_connection_is_closed(port: int) -> None:
    async with connection(port) as (reader, writer):
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert (await read_reply(reader)).status == 200
        async with asyncio.timeout(30):  # the default (30 s) would not close it in time
            assert await reader.read() == b""


async def embed(port: int) -> int:
    body = orjson.dumps(EMBED)
    async with connection(port) as (reader, writer):
        writer.write(head("/v1/embeddings", port, length=len(body)) + body)
        return (await read_reply(reader)).status


async def test_slow_clients_never_delay_healthy_ones(port: int) -> None:
    slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(CAP // 2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # a head, unfinished
            await writer.drain()
            slow.append((reader, writer))
        statuses = [await embed(port) for _ in range(10)]
        assert statuses == [200] * 10
        # Ordering: every healthy request was answered while every slow client still waited.
        still_open = [not r.at_eof() and not r._buffer for r, _ in slow]
        assert all(still_open)
        # ... and every slow one then got its 408.
        replies = await asyncio.gather(*(read_reply(r) for r, _ in slow))
        assert {reply.status for reply in replies} == {408}
    finally:
        for _, writer in slow:
            writer.close()


async def test_one_connection_over_the_cap_gets_503(port: int) -> None:
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(CAP):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
        await asyncio.sleep(0.5)  # let the worker accept them all (no answer to wait for)
        async with connection(port) as (reader, writer):
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            reply = await read_reply(reader)
        assert reply.status == 503, reply
        assert reply.error()["type"] == "overloaded"
        assert int(reply.headers["retry-after"]) >= 1
    finally:
        for writer in held:
            writer.close()
    for _ in range(50):  # the worker sees the closes; then a connection is served again
        await asyncio.sleep(0.2)
        async with connection(port) as (reader, writer):
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            if (await read_reply(reader)).status == 200:
                return
    pytest.fail("connections were never served again after the held ones closed")
