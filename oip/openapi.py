"""``GET /openapi.json`` for either service: the document's bytes, served as they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web


def handler(document: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The ``GET /openapi.json`` handler serving ``document`` (built once, at start-up)."""

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    return openapi
