"""A bare aiohttp hello-world: the ceiling for any aiohttp server on this machine.

``python -m bench.hello --port P``: every POST or GET on any path reads the body and answers a
small JSON document, with uvloop and no access log, as the gateway runs. The gateway bench
compares its cache-hit throughput with this.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from aiohttp import web

BODY = b'{"hello": "world"}'


async def hello(request: web.Request) -> web.Response:
    """Reads the request body (as a real handler must) and answers ``BODY``."""
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


def app() -> web.Application:
    """The application: one catch-all route."""
    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", hello)
    return application


def main(argv: Sequence[str] | None = None) -> int:
    """Serves on 127.0.0.1 until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.hello",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional off Linux/macOS
        pass
    web.run_app(app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
