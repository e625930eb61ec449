"""``GET /openapi.json``: the gateway's OpenAPI 3.1 document (``gateway/http/openapi.json``).

The document is package data, read once when the app is built, and kept true by
``tests/gateway/http/test_openapi.py`` (every registered route is documented with its methods and
nothing else is; the request examples validate and are answered without a 4xx) and by the fuzzer
that is driven by it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

DOCUMENT = Path(__file__).resolve().parent.parent / "openapi.json"


@functools.cache
def load() -> bytes:
    """The document's bytes (read once per process)."""
    return DOCUMENT.read_bytes()


def handler(document: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``GET /openapi.json`` handler serving ``document``."""

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    return openapi
