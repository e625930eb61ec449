"""HTTP edges of the backend over real sockets: the Server header on every response, and what
fails before any middleware (request line or headers too large, not HTTP) answered in JSON and
logged without the offending bytes, in-process and as ``python -m backend serve`` runs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient

from backend.logs import JsonFormatter
from backend.model import EmbeddingModel
from bench.procs import Service, free_port
from tests.backend.serving import infer_body, serving

pytestmark = pytest.mark.model
in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the shared app's event loop

SECRET = "SECRET-token-0123456789abcdef"
BIG = 20 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(models: list[EmbeddingModel]) -> AsyncIterator[TestClient[Any, Any]]:
    async with serving(models) as started:
        yield started


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Sends ``raw`` on a fresh connection; the status, headers and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=10)  # it closes after an error
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in headers.items()}, body


def port_of(client: TestClient[Any, Any]) -> int:
    port = client.server.port
    assert port is not None
    return port


@in_module_loop
async def test_every_response_names_the_server_without_versions(
    client: TestClient[Any, Any],
) -> None:
    calls = [
        client.get("/v2"), client.get("/v2/health/ready"), client.get("/metrics"),
        client.get("/openapi.json"), client.get("/v2/models/minilm"),
        client.post("/v2/models/minilm/infer", json=infer_body(["server header"])),
        client.post("/v2/models/nope/infer", json=infer_body(["x"])),  # 404
        client.post("/v2/models/minilm/infer", data=b"{oops"),  # 400
        client.get("/v2/models/minilm/infer"),  # 405
        client.get("/no/such/route"),  # 404
        client.post("/v1/embeddings", json={"model": "minilm"}),  # 400, OpenAI shape
    ]
    statuses = []
    for call in calls:
        response = await call
        statuses.append(response.status)
        assert response.headers["Server"] == "edge-backend", response.url
    assert statuses == [200, 200, 200, 200, 200, 200, 404, 400, 405, 404, 400]


@pytest.mark.parametrize(
    ("request_text", "status", "message"),
    [
        (f"GET /v2?token={SECRET}{'x' * BIG} HTTP/1.1\r\nHost: x\r\n\r\n", 414,
         "request line is longer than"),
        (f"GET /v2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}{'x' * BIG}\r\n\r\n",
         431, "request header is longer than"),
        ("GET /v2 HTTP/1.1\r\nHost: x\r\n"
         + "".join(f"X-Filler-{i}: {SECRET}\r\n" for i in range(300)) + "\r\n", 431,
         "request headers"),
        (f"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header{SECRET}\r\n\r\n", 400, "not valid HTTP"),
        (f"GET /{SECRET} NOT-HTTP\r\n\r\n", 400, "not valid HTTP"),
    ],
    ids=["20KB-query", "20KB-header", "300-headers", "bad-header", "not-http"],
)
@in_module_loop
async def test_unparsable_requests_get_json_and_leave_no_trace(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture,
    request_text: str, status: int, message: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    got, headers, body = await exchange(port_of(client), request_text.encode())
    assert got == status
    assert headers["server"] == "edge-backend"
    assert headers["content-type"].startswith("application/json")
    error = orjson.loads(body)["error"]
    assert isinstance(error, str) and message in error
    assert SECRET not in body.decode()
    logs = "\n".join(JsonFormatter().format(record) for record in caplog.records)
    assert SECRET not in logs
    lines = [r for r in caplog.records if r.name == "backend.http"]
    assert [r.__dict__["fields"]["status"] for r in lines] == [status]
    assert all(r.levelno < logging.ERROR for r in caplog.records)
    assert (await client.get("/v2/health/live")).status == 200  # still serving


def test_the_served_process_answers_in_json_and_logs_no_values(models_dir: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
            "--port", str(port), "--grpc-port", "0", "--device", "cpu",
            "--log-level", "DEBUG"]
    env = {**os.environ, "BACKEND_WARMUP_LENGTHS": "8", "BACKEND_WARMUP_BATCH_SIZES": "1"}
    with Service("backend-edges", argv, env=env) as server:
        server.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=120)
        for request in (f"GET /v2?key={SECRET}{'x' * BIG} HTTP/1.1\r\nHost: x\r\n\r\n",
                        f"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Api-Key: {SECRET}{'x' * BIG}\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request.encode())
                raw = b""
                for _ in range(100):  # bounded: the server closes after an error answer
                    data = sock.recv(65536)
                    if not data:
                        break
                    raw += data
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] in (b"414", b"431"), raw[:200]
            assert b"\r\nServer: edge-backend\r\n" in head and b"aiohttp" not in head
            assert "error" in orjson.loads(body) and SECRET.encode() not in body
        log = server.log_tail(400)
    assert '"msg":"unparsable request"' in log
    assert SECRET not in log
