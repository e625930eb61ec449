"""HTTP at its edges, over real sockets: bodies split or chunked on the wire and the body limit,
oversized request lines and headers, what errors and headers say about the inside.

Raw bytes go through ``asyncio.open_connection`` so the tests choose exactly how a request is cut
into segments and chunks; every read is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.server import GatewayRunner
from gateway.settings import SettingsError, load_settings
from gateway.telemetry.logs import JsonFormatter
from tests.conftest import REPO, free_port
from tests.gateway.conftest import (
    BackendProc,
    GatewayFactory,
    gateway_env,
    stop_process,
    wait_ready,
)
from tests.gateway.rawhttp import chunk, head, read_reply

LIMIT = 1024 * 1024  # the default max_body_bytes
EMBED = "/v1/embeddings"
SECRET = "sk-live-0123456789abcdefSECRETSECRET"


async def nothing_arrives(reader: asyncio.StreamReader, wait_s: float) -> bool:
    """True when the server sends nothing for ``wait_s`` (it is waiting for more body)."""
    try:
        async with asyncio.timeout(wait_s):
            data = await reader.read(1)
    except TimeoutError:
        return True
    return data == b""  # b"" would be a close: not an answer either, but not a wait


def embed_body(text: str, size: int | None = None) -> bytes:
    """An embeddings request, padded with JSON whitespace to exactly ``size`` bytes."""
    body = orjson.dumps({"model": "minilm", "input": text})
    return body if size is None else body + b" " * (size - len(body))


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[int], Awaitable[Connection]]]:
    """Factory for raw loopback connections, all closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def open_(port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        return reader, writer

    yield open_
    for writer in writers:
        writer.close()


def port_of(client: TestClient[Any, Any]) -> int:
    port = client.server.port
    assert port is not None
    return port


# --- bodies on the wire (issue 12, defect 1) -------------------------------------------------

OIP = "/v2/models/minilm/infer"
OIP_BODY = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "data": ["split oip body"]}]})


@pytest.mark.parametrize(("path", "body"), [(EMBED, embed_body("a body in two segments")),
                                            (OIP, OIP_BODY)], ids=["embeddings", "oip"])
async def test_a_body_in_two_segments_is_read_whole(
    gateway: GatewayFactory, connect: Any, path: str, body: bytes,
) -> None:
    client = await gateway()
    port = port_of(client)
    reader, writer = await connect(port)
    writer.write(head(path, port, length=len(body)) + body[:10])
    await writer.drain()
    # Content-Length promises more: the gateway waits instead of answering the first segment.
    assert await nothing_arrives(reader, 0.3)
    writer.write(body[10:])
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_in_many_small_pieces_with_pauses(
    gateway: GatewayFactory, connect: Any, chunked: bool,
) -> None:
    client = await gateway()
    port = port_of(client)
    body = orjson.dumps({"model": "minilm", "input": [f"piece by piece {i}" for i in range(8)]})
    reader, writer = await connect(port)
    writer.write(head(EMBED, port, length=len(body), chunked=chunked))
    for i in range(0, len(body), 16):  # ~14 pieces, 20 ms apart
        piece = body[i:i + 16]
        writer.write(chunk(piece) if chunked else piece)
        await writer.drain()
        await asyncio.sleep(0.02)
    if chunked:
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 200, reply.body
    assert len(orjson.loads(reply.body)["data"]) == 8


async def test_a_short_body_under_a_large_content_length_waits_for_the_rest(
    gateway: GatewayFactory, connect: Any,
) -> None:
    client = await gateway()
    port = port_of(client)
    reader, writer = await connect(port)
    writer.write(head(EMBED, port, length=1_000_000) + b"{}")
    await writer.drain()
    assert await nothing_arrives(reader, 0.3)  # it used to answer `{}` at once
    writer.write(b" " * (1_000_000 - 2))
    await writer.drain()
    reply = await read_reply(reader)
    # The whole (whitespace-padded) `{}` was read: a schema error, not a parse error.
    assert reply.status == 422 and reply.error()["type"] == "invalid_request", reply.body


@pytest.mark.parametrize(("size", "status"), [(200, 200), (LIMIT, 200), (LIMIT + 1, 413)],
                         ids=["under", "at", "over"])
async def test_chunked_bodies_around_the_limit(
    gateway: GatewayFactory, connect: Any, size: int, status: int,
) -> None:
    client = await gateway()
    port = port_of(client)
    body = embed_body("chunked around the limit", size)
    first = embed_body("chunked around the limit")  # the first chunk alone is valid JSON
    reader, writer = await connect(port)
    writer.write(head(EMBED, port, chunked=True) + chunk(first))
    for i in range(len(first), len(body), 64 * 1024):
        writer.write(chunk(body[i:i + 64 * 1024]))
        await writer.drain()
    if status == 413:
        # No last chunk: the gateway must answer as soon as the body passes the limit rather
        # than read to an end that never comes (or stop at the valid first chunk).
        reply = await read_reply(reader)
        assert reply.status == 413 and reply.error()["type"] == "payload_too_large"
        return
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == status, reply.body


async def test_a_whole_chunked_body_just_over_the_limit_in_one_write_is_413(
    gateway: GatewayFactory, connect: Any,
) -> None:
    # The body is complete when the handler first reads it (the fast path of read_body): the
    # limit still applies to it, by one byte.
    client = await gateway(max_body_bytes=600)
    port = port_of(client)
    reader, writer = await connect(port)
    writer.write(head(EMBED, port, chunked=True) + chunk(embed_body("one write", 601))
                 + b"0\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 413 and reply.error()["type"] == "payload_too_large"


async def test_a_chunked_body_far_over_the_limit_is_413(
    gateway: GatewayFactory, connect: Any,
) -> None:
    client = await gateway()
    port = port_of(client)
    reader, writer = await connect(port)
    writer.write(head(EMBED, port, chunked=True) + chunk(embed_body("valid first chunk")))
    filler = chunk(b" " * (256 * 1024))
    for _ in range(8):  # 2 MiB after the first chunk, then the end of the body
        writer.write(filler)
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 413 and reply.error()["type"] == "payload_too_large"


async def test_one_megabyte_bodies_from_httpx(gateway: GatewayFactory) -> None:
    client = await gateway()
    body = embed_body("a one megabyte request " * 43_000)  # ~989 KB, under the 1 MiB limit
    assert 900_000 < len(body) < LIMIT
    url = f"http://127.0.0.1:{port_of(client)}{EMBED}"
    async with httpx.AsyncClient(timeout=30) as http:
        statuses = [(await http.post(url, content=body,
                                     headers={"Content-Type": "application/json"})).status_code
                    for _ in range(10)]
    assert statuses == [200] * 10


# --- /metrics behind a token (defect 5a) ------------------------------------------------------

METRICS_TOKEN = "metrics-token-0123456789"


async def test_metrics_is_open_without_a_token(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert "gateway_" in await resp.text()


async def test_metrics_needs_the_token_when_one_is_set(gateway: GatewayFactory,
                                                       connect: Any) -> None:
    client = await gateway(metrics_token=METRICS_TOKEN)
    reader, writer = await connect(port_of(client))  # a token that is not UTF-8: 401, not 500
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == 401 and reply.error()["type"] == "unauthorized"
    for headers in ({}, {"Authorization": "Bearer not-the-token"},
                    {"Authorization": f"Basic {METRICS_TOKEN}"}):
        resp = await client.get("/metrics", headers=headers)
        assert resp.status == 401, headers
        body = await resp.json()
        assert body["error"]["type"] == "unauthorized"
        assert body["error"]["request_id"] == resp.headers["X-Request-Id"]
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    resp = await client.get(f"/metrics?token={METRICS_TOKEN}")  # header only, never the query
    assert resp.status == 401
    resp = await client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert resp.status == 200
    assert "gateway_" in await resp.text()


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "caf\u00e9"])
def test_metrics_token_is_validated(bad: str) -> None:
    with pytest.raises(SettingsError, match="metrics_token"):
        load_settings(None, {"backends": ["http://127.0.0.1:1"], "metrics_token": bad},
                      environ={})


def test_metrics_token_comes_from_the_environment() -> None:
    settings = load_settings(None, {"backends": ["http://127.0.0.1:1"]},
                             environ={"GATEWAY_METRICS_TOKEN": METRICS_TOKEN})
    assert settings.metrics_token == METRICS_TOKEN


# --- 405 (issue 10) ---------------------------------------------------------------------------

async def test_an_admin_token_that_is_not_utf8_is_401_not_500(gateway: GatewayFactory,
                                                            connect: Any) -> None:
    client = await gateway(admin_token="admin-token-0123456789")
    for path in (b"/admin/stats", b"/dashboard/stats.json"):
        reader, writer = await connect(port_of(client))
        writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer \xff\xfe\r\n\r\n")
        await writer.drain()
        reply = await read_reply(reader)
        assert reply.status == 401 and reply.error()["type"] == "unauthorized", path


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", EMBED, "POST"), ("DELETE", "/v2/models/minilm/infer", "POST"),
    ("POST", "/metrics", "GET, HEAD"),
])
async def test_405_names_the_methods_the_route_takes(
    gateway: GatewayFactory, method: str, path: str, allow: str,
) -> None:
    client = await gateway()
    resp = await client.request(method, path)
    assert resp.status == 405
    assert resp.headers["Allow"] == allow
    err = (await resp.json())["error"]
    assert err["type"] == "method_not_allowed"
    assert method in err["message"] and allow in err["message"]


# --- errors before any middleware: request line and headers too large (defect 5b, 5d) ---------

class GatewayTestServer(TestServer):
    """A TestServer that serves through ``GatewayRunner``, as ``python -m gateway serve`` does."""

    async def _make_runner(self, **kwargs: Any) -> GatewayRunner:
        return GatewayRunner(self.app, **kwargs)


@pytest.fixture
async def served(backend: BackendProc, aiohttp_client: Any) -> TestClient[Any, Any]:
    settings = load_settings(None, {"backends": [backend.url], "routing.health_interval_s": 0.5},
                             environ={})
    app = create_app(settings, registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(GatewayTestServer(app))
    return client


def rendered_logs(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as the gateway writes it: message, extra fields and traceback."""
    formatter = JsonFormatter()
    return "\n".join(formatter.format(r) for r in caplog.records)


BIG = 20 * 1024


@pytest.mark.parametrize(("where", "status", "etype"), [
    ("header", 431, "headers_too_large"),
    ("query", 414, "uri_too_long"),
], ids=["20KB-header", "20KB-query"])
async def test_oversized_request_parts_get_json_and_leave_no_trace(
    served: TestClient[Any, Any], connect: Any, caplog: pytest.LogCaptureFixture,
    where: str, status: int, etype: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    port = port_of(served)
    secret = SECRET + "x" * (BIG - len(SECRET))
    if where == "header":
        request = (f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Authorization: Bearer {secret}\r\n\r\n")
    else:
        request = f"GET /healthz?token={secret} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    reader, writer = await connect(port)
    writer.write(request.encode())
    await writer.drain()
    reply = await read_reply(reader)
    assert reply.status == status
    err = reply.error()
    assert err["type"] == etype and err["request_id"] == reply.headers["x-request-id"]
    assert SECRET not in reply.body.decode()
    assert reply.headers["server"] == "edge-gateway"
    logs = rendered_logs(caplog)
    assert SECRET[:12] not in logs and "SECRET" not in logs
    lines = [r for r in caplog.records if r.name == "gateway.http"]
    assert [r.__dict__["status"] for r in lines] == [status]
    assert all(r.levelno < logging.ERROR for r in caplog.records)
    ok = await served.get("/healthz")  # the server keeps serving
    assert ok.status == 200


async def test_too_many_headers_and_garbage_get_json(
    served: TestClient[Any, Any], connect: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    port = port_of(served)
    many = "".join(f"X-Filler-{i}: {SECRET}\r\n" for i in range(300))
    cases = [
        (f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n", 431, "headers_too_large"),
        (f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header{SECRET}\r\n\r\n", 400,
         "bad_request"),
        (f"GET /{SECRET} NOT-HTTP\r\n\r\n", 400, "bad_request"),
    ]
    for request, status, etype in cases:
        reader, writer = await connect(port)
        writer.write(request.encode())
        await writer.drain()
        reply = await read_reply(reader)
        assert (reply.status, reply.error()["type"]) == (status, etype), request[:40]
        assert SECRET not in reply.body.decode()
        assert reply.headers["server"] == "edge-gateway"
    assert SECRET not in rendered_logs(caplog)


async def test_the_server_header_names_no_versions(
    served: TestClient[Any, Any], gateway: GatewayFactory,
) -> None:
    plain = await gateway()  # the app under aiohttp's own runner: the middleware sets it too
    for client in (served, plain):
        for path in ("/healthz", "/no/such/route", "/metrics"):
            resp = await client.get(path)
            assert resp.headers["Server"] == "edge-gateway", path
        resp = await client.post(EMBED, json={"model": "minilm", "input": "server header"})
        assert resp.status == 200
        assert resp.headers["Server"] == "edge-gateway"


def test_the_served_process_answers_oversized_headers_in_json(backend: BackendProc) -> None:
    """``python -m gateway serve`` as deployed: JSON 431, no versions, no secret on stderr."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--workers", "1",
         "--backend", backend.url], cwd=REPO, env=gateway_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/healthz", timeout_s=60, what="gateway")
        ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert ok.headers["Server"] == "edge-gateway"
        secret = SECRET + "x" * (BIG - len(SECRET))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Api-Key: {secret}\r\n\r\n"
                         .encode())
            raw = b""
            for _ in range(100):  # bounded: the gateway closes after an error answer
                data = sock.recv(65536)
                if not data:
                    break
                raw += data
        head_, _, body = raw.partition(b"\r\n\r\n")
        assert head_.split(b" ")[1] == b"431", raw[:200]  # (HTTP/1.0: no request to echo)
        assert b"\r\nServer: edge-gateway\r\n" in head_ and b"aiohttp" not in head_
        assert orjson.loads(body)["error"]["type"] == "headers_too_large"
    finally:
        stop_process(proc)
    assert proc.returncode == 0
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert "SECRET" not in err and SECRET[:12] not in err
    assert '"msg":"unparsable request"' in err and '"status":431' in err


# --- upstream errors name no backend (defect 5c) ----------------------------------------------

async def test_backend_failures_name_no_address(
    aiohttp_client: Any, fakes: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    fake = await fakes()
    settings = load_settings(None, {"backends": [fake.url], "routing.health_interval_s": 0.2},
                             environ={})
    client = await aiohttp_client(TestServer(create_app(settings, registry=CollectorRegistry())))
    for _ in range(100):  # bounded: the first health check marks the fake ready
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.05)
    caplog.set_level(logging.WARNING, logger="gateway.errors")
    address = f"127.0.0.1:{fake.port}"
    fake.error_status = 500
    resp = await client.post(EMBED, json={"model": "minilm", "input": "backend fails"},
                             headers={"X-Request-Id": "edge-502"})
    assert resp.status == 502
    text = await resp.text()
    err = orjson.loads(text)["error"]
    assert err["type"] == "bad_gateway" and err["message"] == "backend unavailable"
    assert address not in text and str(fake.port) not in text
    logged = [r for r in caplog.records if r.name == "gateway.errors"]
    assert len(logged) == 1 and logged[0].__dict__["request_id"] == "edge-502"
    assert address in logged[0].__dict__["detail"]
    assert "backend fails" not in rendered_logs(caplog)  # the request's text never


@pytest.mark.parametrize("error", [
    BadGateway("backend 10.0.0.7:8001 answered 500: boom"),
    DeadlineExceeded("backend 10.0.0.7:8001 did not answer within the read timeout"),
    Overloaded("backend 10.0.0.7:8001 is overloaded", reason="backend_overloaded"),
], ids=["502", "504", "503"])
def test_upstream_errors_keep_the_address_for_the_logs_only(error: Any) -> None:
    assert "10.0.0.7" in error.message
    assert not re.search(r"\d+\.\d+\.\d+\.\d+|:\d{2,5}", error.public_message)


def test_errors_of_the_gateway_itself_keep_their_words() -> None:
    shed = Overloaded("upstream queue for tier 'local' is full", reason="queue_full")
    assert shed.public_message == shed.message
