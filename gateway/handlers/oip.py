"""Open Inference Protocol v2 routes: ``infer`` (cached) and metadata/health passthrough."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from gateway import state
from gateway.handlers.common import cache_headers, make_context, resolve_model
from gateway.handlers.parsing import read_json
from gateway.middleware import request_id_of
from gateway.oip_pipeline import validate

MAX_TENSOR_ELEMENTS = 4096


async def infer(request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    settings = request.app[state.SETTINGS]
    model = resolve_model(request, request.match_info["name"])
    data = await read_json(request, settings.max_body_bytes)
    # A hard cap against huge flattened tensors; the policy's max_items is the real limit.
    req = validate(data, max_items=MAX_TENSOR_ELEMENTS)
    ctx = make_context(request, "/v2/models/{name}/infer")
    ctx.add_timing("parse", time.perf_counter() - t0)
    answer = await request.app[state.OIP].infer(ctx, model, req)
    return web.Response(body=answer.body, content_type="application/json",
                        headers=cache_headers(ctx, answer.age_s))


async def model_metadata(request: web.Request) -> web.Response:
    model = resolve_model(request, request.match_info["name"])
    version = request.match_info.get("version")
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    raw = await request.app[state.UPSTREAM].get(path, request_id=request_id_of(request))
    return web.Response(status=raw.status, body=raw.body, content_type="application/json")


async def server_ready(request: web.Request) -> web.Response:
    ready = request.app[state.ROUTER].ready()
    return web.Response(status=200 if ready else 503,
                        body=orjson.dumps({"ready": ready}), content_type="application/json")


async def server_live(request: web.Request) -> web.Response:
    return web.Response(body=b'{"live":true}', content_type="application/json")
