"""Clients that split, stall, corrupt or abandon their request bodies, over raw sockets.

The server runs as ``python -m backend serve`` runs it (``DeployedServer``: handlers are not
cancelled when their client goes), with a counting wrapper around the real model so that a test
can tell whether a request reached the tokenizer or the model.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient

from backend.model import EmbeddingModel
from tests.backend.serving import CountingModel, infer_body, scrape, serving

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

BODY_LIMIT = 64 * 1024
OIP = "/v2/models/minilm/infer"


@pytest.fixture(scope="module")
def model(models: list[EmbeddingModel]) -> CountingModel:
    return CountingModel(models[0])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(model: CountingModel) -> AsyncIterator[TestClient[Any, Any]]:
    async with serving([model], client_max_size=BODY_LIMIT) as started:
        yield started


def request_head(path: str, *, length: int | None = None, **headers: str) -> bytes:
    """A POST request's head; ``length`` None: chunked."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def exchange(port: int, parts: list[bytes], *, pause_s: float = 0.0
                   ) -> tuple[int, dict[str, Any]]:
    """Sends ``parts`` with ``pause_s`` between them, then reads the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index, part in enumerate(parts):
            if index and pause_s:
                await asyncio.sleep(pause_s)
            writer.write(part)
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=60)  # Connection: close
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


async def abandon(port: int, parts: list[bytes], *, reset: bool) -> None:
    """Sends ``parts`` and goes away: closes (FIN) or, with ``reset``, aborts (RST)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    for part in parts:
        writer.write(part)
        await writer.drain()
    if reset:
        writer.transport.abort()
    else:
        writer.close()
    await writer.wait_closed()


async def wait_for_metric(client: TestClient[Any, Any], name: str, target: float,
                          **labels: str) -> None:
    for _ in range(400):  # up to ~20 s
        if await scrape(client, name, **labels) >= target:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}{labels} never reached {target}")


@pytest.mark.parametrize("path", [OIP, "/v1/embeddings"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
async def test_client_leaving_mid_body_is_dropped_quietly(
    client: TestClient[Any, Any], model: CountingModel, caplog: pytest.LogCaptureFixture,
    path: str, chunked: bool, reset: bool,
) -> None:
    body = orjson.dumps({"model": "minilm", "input": ["abandoned"]} if path != OIP
                        else infer_body(["abandoned"]))
    half = body[: len(body) // 2]
    head = request_head(path, length=None if chunked else len(body))
    dropped = await scrape(client, "backend_requests_total", status="499")
    calls = model.calls
    with caplog.at_level(logging.DEBUG):
        await abandon(client.port, [head, chunk(half) if chunked else half], reset=reset)
        await wait_for_metric(client, "backend_requests_total", dropped + 1, status="499")
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [(r.name, r.getMessage()) for r in loud]
    assert await scrape(client, "backend_requests_total", status="500") == 0
    assert model.calls == calls  # nothing tokenized, nothing queued
    still = orjson.dumps(infer_body(["still serving"]))
    status, answer = await exchange(client.port, [request_head(OIP, length=len(still)), still])
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384]


async def test_body_split_across_segments_is_read_whole(client: TestClient[Any, Any]) -> None:
    texts = ["a body that arrives in pieces", "and is still read to its last byte"]
    # The id is the body's last field: only a server that read the whole body can echo it.
    body = orjson.dumps(infer_body(texts, outputs=[{"name": "token_count"}], id="split-7"))
    whole = await exchange(client.port, [request_head(OIP, length=len(body)) + body])
    cut = len(body) // 3
    split = await exchange(client.port, [request_head(OIP, length=len(body)) + body[:cut],
                                         body[cut:]], pause_s=0.3)
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]
    chunked = await exchange(client.port, [request_head(OIP), *map(chunk, pieces), b"0\r\n\r\n"],
                             pause_s=0.005)
    for status, answer in (whole, split, chunked):
        assert status == 200, answer
        assert answer["id"] == "split-7"
        assert answer["outputs"] == whole[1]["outputs"]


@pytest.mark.parametrize(("size", "status"), [(BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)])
async def test_chunked_body_at_and_past_the_body_limit(
    client: TestClient[Any, Any], model: CountingModel, size: int, status: int,
) -> None:
    body = orjson.dumps(infer_body(["padded"]))
    body += b" " * (size - len(body))  # JSON allows trailing whitespace
    calls = model.calls
    pieces = [chunk(body[i:i + 4096]) for i in range(0, len(body), 4096)]
    got, answer = await exchange(client.port, [request_head(OIP), *pieces, b"0\r\n\r\n"])
    assert got == status, answer
    if status == 413:
        assert f"limit of {BODY_LIMIT} bytes" in answer["error"]
        assert model.calls == calls


async def test_corrupt_compressed_body_is_a_json_400(
    client: TestClient[Any, Any], model: CountingModel, caplog: pytest.LogCaptureFixture,
) -> None:
    junk = b"not gzip at all"
    calls = model.calls
    with caplog.at_level(logging.DEBUG):
        status, answer = await exchange(client.port, [
            request_head(OIP, length=len(junk), Content_Encoding="gzip") + junk])
    assert status == 400 and "cannot be read" in answer["error"]
    assert model.calls == calls
    # aiohttp itself may log its lingering read of the broken payload; the backend must not.
    ours = [r for r in caplog.records if r.name.startswith("backend.")
            and (r.levelno >= logging.WARNING or r.exc_info)]
    assert ours == []
    good = gzip.compress(orjson.dumps(infer_body(["zipped"])))
    status, answer = await exchange(client.port, [
        request_head(OIP, length=len(good), Content_Encoding="gzip") + good])
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384]
