"""A deterministic fake OIP v2 backend with a fixed capacity: ``slots`` x ``service_ms``.

``python -m bench.slow_backend --port P [--slots 4] [--service-ms 20] [--dim 384]``

The real model's CPU use on a 2-core machine competes with the gateway and the load generator,
so its capacity moves with everything else running; this fake's does not. Each infer request
waits for one of ``slots`` (FIFO, ``max_queue`` waiters at most, 503 + ``Retry-After`` past
that), holds it for ``service_ms`` (a sleep, no CPU), and answers a well-formed OIP embedding
response (a fixed unit vector per text, ``dim`` floats), so capacity is exactly
``slots / service_ms`` requests per second. It speaks the part of the backend wire protocol
the gateway uses (docs/ARCHITECTURE.md): health, model metadata, infer, ``Server-Timing``, and
binary outputs when the request asks with ``binary_data_output`` (as the real backend does).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import struct
import time
from collections.abc import Sequence

import orjson
from aiohttp import web

MODEL = "minilm"


class SlowBackend:
    """The fake's state: the slots, the queue bound, and counters for the report."""

    def __init__(self, *, slots: int, service_ms: float, dim: int, max_queue: int) -> None:
        if slots < 1 or service_ms < 0 or dim < 1 or max_queue < 0:
            raise ValueError("slots >= 1, service_ms >= 0, dim >= 1 and max_queue >= 0")
        self.slots = asyncio.Semaphore(slots)
        self.service_s = service_ms / 1000.0
        self.service_ms = service_ms
        self.max_queue = max_queue
        self.waiting = 0
        self.served = 0
        self.rejected = 0
        self.vector = [1.0 / math.sqrt(dim)] * dim
        self.packed = struct.pack(f"<{dim}f", *self.vector)  # the same vector, as raw FP32
        self.dim = dim

    def app(self) -> web.Application:
        """The aiohttp application with the OIP routes."""
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2/health/live", self.ready)
        app.router.add_get("/v2/models/{name}", self.metadata)
        app.router.add_get("/v2/models/{name}/ready", self.ready)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        app.router.add_get("/stats", self.stats)
        return app

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.served, "rejected": self.rejected,
                                  "waiting": self.waiting})

    async def metadata(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != MODEL:
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response({
            "name": MODEL, "versions": ["1"], "platform": "fake",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, self.dim]}],
        })

    async def infer(self, request: web.Request) -> web.Response:
        rid = {"X-Request-Id": request.headers.get("X-Request-Id", "")}
        if request.match_info["name"] != MODEL:
            return web.json_response({"error": "unknown model"}, status=404, headers=rid)
        try:
            doc = orjson.loads(await request.read())
            n = len(doc["inputs"][0]["data"])
            binary = doc.get("parameters", {}).get("binary_data_output") is True
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            return web.json_response({"error": "bad infer request"}, status=400, headers=rid)
        if self.waiting >= self.max_queue and self.slots.locked():
            self.rejected += 1
            return web.json_response({"error": "queue full"}, status=503,
                                     headers={**rid, "Retry-After": "1"})
        queued = time.perf_counter()
        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        try:
            queue_ms = (time.perf_counter() - queued) * 1000.0
            if self.service_s > 0:
                await asyncio.sleep(self.service_s)
        finally:
            self.slots.release()
        self.served += 1
        output: dict[str, object] = {"name": "embedding", "datatype": "FP32",
                                     "shape": [n, self.dim]}
        if binary:
            output["parameters"] = {"binary_data_size": len(self.packed) * n}
        else:
            output["data"] = self.vector * n
        body = orjson.dumps({
            "model_name": MODEL, "model_version": "1",
            "parameters": {"queue_time_ms": round(queue_ms, 3),
                           "compute_time_ms": self.service_ms, "batch_size": n},
            "outputs": [output],
        })
        headers = {**rid, "Server-Timing": f"queue;dur={queue_ms:.3f}, "
                                           f"compute;dur={self.service_ms:g}"}
        if not binary:
            return web.Response(body=body, content_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(len(body))
        return web.Response(body=body + self.packed * n, headers=headers,
                            content_type="application/octet-stream")


def main(argv: Sequence[str] | None = None) -> int:
    """Serves the fake on 127.0.0.1 until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.slow_backend",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--max-queue", type=int, default=1024)
    args = parser.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional off Linux/macOS
        pass

    async def make_app() -> web.Application:
        # The semaphore must be made on the loop that serves it.
        return SlowBackend(slots=args.slots, service_ms=args.service_ms, dim=args.dim,
                           max_queue=args.max_queue).app()

    web.run_app(make_app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
