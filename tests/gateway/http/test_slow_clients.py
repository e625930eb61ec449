"""Slow and split clients against a real gateway process (``python -m gateway serve``, one
worker, the real backend behind it), over raw loopback sockets.

Header lines dribbled byte by byte, bodies in many small pieces or chunks with pauses on every
inference route, chunk framing cut mid-line, Content-Length bodies just under, at and over the
1 MiB limit, uploads abandoned halfway, and a crowd of slow clients while others are served.
(``test_http_edges.py`` covers the in-process app: two-segment bodies, chunked bodies around the
limit.) Every read is bounded by a timeout and every loop by a count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from bench import services
from tests.gateway.conftest import BackendProc
from tests.gateway.rawhttp import chunk, head, read_reply

LIMIT = 1024 * 1024  # the default max_body_bytes
EMBED = "/v1/embeddings"
ROUTES = {
    EMBED: {"model": "minilm", "input": [f"slow client text {i}" for i in range(6)]},
    "/v1/classify": {"model": "minilm", "input": "slow classify", "labels": ["a", "b", "c"]},
    "/v1/rank": {"model": "minilm", "query": "slow rank", "documents": ["one", "two", "three"]},
    "/v2/models/minilm/infer": {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                            "data": ["slow oip", "second"]}]},
}


@pytest.fixture(scope="module")
def port(backend: BackendProc) -> Iterator[int]:
    """A real gateway process in front of the session's backend; its port."""
    with services.gateway(backend.url, cores=None, name="slow-clients",
                          settings={"logging": {"level": "WARNING"}}) as gw:
        yield gw.port


@pytest.fixture
async def connect(port: int) -> AsyncIterator[Any]:
    """Factory for raw connections to the gateway, all closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def open_() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        return reader, writer

    yield open_
    for writer in writers:
        writer.close()


def padded(text: str, size: int) -> bytes:
    """An embeddings request padded with JSON whitespace to exactly ``size`` bytes."""
    body = orjson.dumps({"model": "minilm", "input": text})
    return body + b" " * (size - len(body))


async def dribble(writer: asyncio.StreamWriter, data: bytes, piece: int, pause_s: float) -> None:
    for i in range(0, len(data), piece):
        writer.write(data[i:i + piece])
        await writer.drain()
        await asyncio.sleep(pause_s)


async def test_header_lines_sent_byte_by_byte(connect: Any, port: int) -> None:
    body = orjson.dumps(ROUTES[EMBED])
    request = (f"POST {EMBED} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               f"X-Request-Id: slow-header-line-0123456789\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    reader, writer = await connect()
    await dribble(writer, request, 1, 0.002)  # ~130 bytes, ~0.3 s in all
    writer.write(body)
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"] == "slow-header-line-0123456789"
    assert len(reply.json()["data"]) == 6


async def test_many_header_lines_each_in_pieces(connect: Any, port: int) -> None:
    body = orjson.dumps(ROUTES[EMBED])
    extra = "".join(f"X-Filler-{i}: {'v' * 40}\r\n" for i in range(30))
    request = (f"POST {EMBED} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    reader, writer = await connect()
    await dribble(writer, request + body, 7, 0.001)
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", list(ROUTES))
async def test_every_route_reads_a_body_in_small_pieces_with_pauses(
    connect: Any, port: int, path: str, chunked: bool,
) -> None:
    body = orjson.dumps(ROUTES[path])
    reader, writer = await connect()
    writer.write(head(path, port, length=len(body), chunked=chunked))
    for i in range(0, len(body), 9):  # ~15-25 pieces, 15 ms apart
        piece = body[i:i + 9]
        writer.write(chunk(piece) if chunked else piece)
        await writer.drain()
        await asyncio.sleep(0.015)
    if chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body
    assert reply.json()  # a whole JSON answer


async def test_chunk_framing_cut_mid_line(connect: Any, port: int) -> None:
    body = orjson.dumps(ROUTES[EMBED])
    framed = b"".join(chunk(body[i:i + 20]) for i in range(0, len(body), 20)) + b"0\r\n\r\n"
    reader, writer = await connect()
    writer.write(head(EMBED, port, chunked=True))
    # Segments of 3 bytes cut through chunk-size lines, CRLFs and data alike.
    await dribble(writer, framed, 3, 0.001)
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body
    assert len(reply.json()["data"]) == 6


@pytest.mark.parametrize(("size", "status"), [(LIMIT - 1, 200), (LIMIT, 200)],
                         ids=["just-under", "at"])
async def test_content_length_bodies_up_to_the_limit_in_small_chunks(
    connect: Any, port: int, size: int, status: int,
) -> None:
    body = padded("at the limit", size)
    reader, writer = await connect()
    writer.write(head(EMBED, port, length=size))
    for n, i in enumerate(range(0, size, 4096)):  # 256 pieces, a pause every 32
        writer.write(body[i:i + 4096])
        await writer.drain()
        if n % 32 == 0:
            await asyncio.sleep(0.01)
    reply = await read_reply(reader)
    assert reply.status == status, reply.body


async def test_chunked_upload_at_the_limit_in_many_small_chunks(connect: Any, port: int) -> None:
    body = padded("chunked at the limit", LIMIT)
    reader, writer = await connect()
    writer.write(head(EMBED, port, chunked=True))
    for n, i in enumerate(range(0, LIMIT, 1024)):  # 1024 chunks of 1 KiB
        writer.write(chunk(body[i:i + 1024]))
        if n % 64 == 0:
            await writer.drain()
            await asyncio.sleep(0.005)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_one_byte_over_the_limit_is_413(connect: Any, port: int, chunked: bool) -> None:
    body = padded("over the limit", LIMIT + 1)
    reader, writer = await connect()
    writer.write(head(EMBED, port, length=len(body), chunked=chunked))
    for i in range(0, len(body), 32 * 1024):
        piece = body[i:i + 32 * 1024]
        writer.write(chunk(piece) if chunked else piece)
        try:
            await writer.drain()
        except ConnectionError:  # the gateway may answer and close before the rest is sent
            break
    if chunked:
        writer.write(b"0\r\n\r\n")
    reply = await read_reply(reader)
    assert reply.status == 413
    error = reply.json()["error"]
    assert error["type"] == "payload_too_large" and error["request_id"]


async def test_abandoned_uploads_leave_the_gateway_serving(connect: Any, port: int) -> None:
    body = orjson.dumps(ROUTES[EMBED])
    for chunked in (False, True):
        for cut in (1, len(body) // 2, len(body) - 1):
            _, writer = await connect()
            writer.write(head(EMBED, port, length=len(body), chunked=chunked))
            writer.write(chunk(body[:cut]) if chunked else body[:cut])
            await writer.drain()
            writer.close()
    reader, writer = await connect()
    writer.write(head(EMBED, port, length=len(body)) + body)
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body


async def test_a_crowd_of_slow_clients_does_not_stop_others(connect: Any, port: int) -> None:
    """40 connections dribble their requests while 10 ordinary requests are served."""
    slow_bodies = [orjson.dumps({"model": "minilm", "input": f"crowd {i}"}) for i in range(40)]

    async def slow(i: int) -> int:
        reader, writer = await connect()
        body = slow_bodies[i]
        await dribble(writer, head(EMBED, port, length=len(body)) + body, 16, 0.05)
        return (await read_reply(reader)).status

    async def quick(i: int) -> int:
        reader, writer = await connect()
        body = orjson.dumps({"model": "minilm", "input": f"quick {i}"})
        writer.write(head(EMBED, port, length=len(body)) + body)
        await writer.drain()
        return (await read_reply(reader)).status

    crowd = [asyncio.create_task(slow(i)) for i in range(40)]
    await asyncio.sleep(0.1)  # the crowd holds its connections open, mid-request
    quick_statuses = [await quick(i) for i in range(10)]
    assert quick_statuses == [200] * 10
    assert await asyncio.gather(*crowd) == [200] * 40
