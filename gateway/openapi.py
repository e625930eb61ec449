"""``GET /openapi.json``: the gateway's OpenAPI 3.1 document (``gateway/openapi.json``).

The document is package data, read once when the app is built (less the ``/admin`` routes when
they are off), and kept true by
``tests/gateway/test_openapi.py`` (every registered route is documented with its methods and
nothing else is; the request examples validate and are answered without a 4xx) and by the fuzzer
that is driven by it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from aiohttp import web

DOCUMENT = Path(__file__).resolve().parent / "openapi.json"


@functools.cache
def load() -> bytes:
    """The document's bytes (read once per process)."""
    return DOCUMENT.read_bytes()


def served(document: bytes, *, admin: bool) -> bytes:
    """The document as this gateway serves it: without an admin token the ``/admin`` routes do
    not exist (every ``/admin`` path is a plain 404), so they are left out of it."""
    if admin:
        return document
    data = orjson.loads(document)
    data["paths"] = {path: item for path, item in data["paths"].items()
                     if not path.startswith("/admin/")}
    return orjson.dumps(data)


def handler(document: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``GET /openapi.json`` handler serving ``document``."""

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    return openapi
