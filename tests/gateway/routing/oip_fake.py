"""A small real OIP v2 server on loopback, for the behaviour a real backend cannot show on demand.

It speaks the backend wire protocol (docs/ARCHITECTURE.md) with deterministic fake embeddings,
and has knobs to be slow, to hang, to shed with 503, to answer garbage or a wrong shape, and to
die (close its listener and connections) and come back on the same port.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fake_embedding(text: str, dim: int) -> list[float]:
    """The embedding the fake answers for ``text`` (dim <= 32)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [(b - 127.5) / 127.5 for b in digest[:dim]]


class FakeBackend:
    """An OIP v2 server with knobs; ``start``/``stop`` (die) may repeat on the same port."""

    def __init__(self, *, port: int | None = None, model: str = "minilm", version: str = "1",
                 dim: int = 8) -> None:
        self.port = port or free_port()
        self.model = model
        self.version = version
        self.dim = dim
        # knobs
        self.delay_s = 0.0
        self.hang = False
        self.overloaded = False
        self.retry_after = "3"
        self.garbage = False
        self.wrong_shape = False
        self.error_status: int | None = None
        self.ready = True
        self.health_delay_s = 0.0
        self.slots: int | None = None  # a capacity: past it, calls wait (set before start)
        # observations
        self.infer_requests = 0
        self.completed = 0
        self.cancelled = 0
        self.inflight = 0
        self.max_inflight = 0
        self.health_requests = 0
        self.last_headers: Mapping[str, str] = {}
        self._runner: web.AppRunner | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.slots) if self.slots else None
        app = web.Application()
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_get("/v2/models/{name}", self._metadata)
        app.router.add_post("/v2/models/{name}/infer", self._infer)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2,
                               access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()
        self._runner = runner

    async def stop(self) -> None:
        """Die: close the listener and every open connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _ready(self, request: web.Request) -> web.Response:
        self.health_requests += 1
        if self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    async def _metadata(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != self.model:
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response({
            "name": self.model, "versions": [self.version], "platform": "fake",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, self.dim]}],
        })

    async def _infer(self, request: web.Request) -> web.Response:
        self.infer_requests += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self.last_headers = request.headers.copy()  # case-insensitive
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.inflight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        rid = {"X-Request-Id": request.headers.get("X-Request-Id", "")}
        if self.overloaded:
            return web.json_response({"error": "queue full"}, status=503,
                                     headers={**rid, "Retry-After": self.retry_after})
        if self.error_status is not None:
            return web.json_response({"error": f"fake error {self.error_status}"},
                                     status=self.error_status, headers=rid)
        doc: dict[str, Any] = orjson.loads(await request.read())
        texts = doc["inputs"][0]["data"]
        if self.hang:
            await asyncio.sleep(60)
        if self.delay_s:
            if self._slots is not None:
                async with self._slots:
                    await asyncio.sleep(self.delay_s)
            else:
                await asyncio.sleep(self.delay_s)
        if self.garbage:
            return web.Response(body=b'{"outputs": [', content_type="application/json",
                                headers=rid)
        n = len(texts)
        dim = self.dim + 1 if self.wrong_shape else self.dim
        data = [x for text in texts for x in fake_embedding(text, self.dim)]
        body = {
            "model_name": self.model, "model_version": self.version,
            "parameters": {"queue_time_ms": 0.5, "compute_time_ms": 1.5, "batch_size": n},
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [n, dim],
                         "data": data}],
        }
        self.completed += 1
        return web.Response(
            body=orjson.dumps(body), content_type="application/json",
            headers={**rid, "Server-Timing": "queue;dur=0.5, compute;dur=1.5"},
        )
