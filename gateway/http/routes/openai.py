"""``/v1/embeddings`` (OpenAI-compatible), ``/v1/classify`` and ``/v1/rank``: HTTP in and out.

The route's adapter (``gateway.adapters.texts``) parses and renders; the one pipeline answers.
Order: tenant (401) before the body is read, then body (415, 413, 400), then the schema (422),
all before any cache or backend work.
"""

from __future__ import annotations

from aiohttp import web

from gateway.adapters.texts import parse_classify, parse_embeddings, parse_rank
from gateway.http import app_state as state
from gateway.http.serve import resolver, serve


async def embeddings(request: web.Request) -> web.Response:
    app = request.app
    return await serve(request, "/v1/embeddings", lambda data: parse_embeddings(
        data, resolver(request), width=app[state.ROUTER].model_width,
        fragments=app[state.FRAGMENTS]))


async def classify(request: web.Request) -> web.Response:
    return await serve(request, "/v1/classify",
                       lambda data: parse_classify(data, resolver(request)))


async def rank(request: web.Request) -> web.Response:
    return await serve(request, "/v1/rank", lambda data: parse_rank(data, resolver(request)))
