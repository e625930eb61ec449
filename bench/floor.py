"""The floor for a cache hit on this stack: aiohttp + uvloop answering pre-encoded bytes.

``python -m bench.floor --port P --answer FILE``: every POST reads the request body (as a real
handler must) and answers the body and headers stored in FILE (JSON: ``{"body": str,
"headers": {...}}``, taken from a real gateway hit), with no middleware, no access log and no
work besides. The gateway bench compares its hit throughput and CPU per hit with this: what is
left above it is the gateway's own work.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

import orjson
from aiohttp import web


def app(body: bytes, headers: dict[str, str]) -> web.Application:
    """One catch-all route answering ``body`` with ``headers``."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json", headers=headers)

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", answer)
    return application


def main(argv: Sequence[str] | None = None) -> int:
    """Serves on 127.0.0.1 until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.floor",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer", type=Path, required=True)
    args = parser.parse_args(argv)
    stored = orjson.loads(args.answer.read_bytes())
    # Framing and per-connection headers are the server's own (the capture's client asked for
    # Connection: close); the rest is the gateway's answer as a client sees it.
    skip = ("content-length", "content-type", "date", "server", "connection", "keep-alive",
            "transfer-encoding")
    headers = {k: v for k, v in stored["headers"].items() if k.lower() not in skip}
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional off Linux/macOS
        pass
    web.run_app(app(stored["body"].encode(), headers), host=args.host, port=args.port,
                access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
