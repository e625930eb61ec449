"""Open Inference Protocol v2 routes besides ``infer`` (a cached route: gateway/http/routes/
cached.py): model metadata passed through, the gateway's own health."""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.errors import BadGateway, ModelNotFound
from gateway.http import app_state as state
from gateway.http.middleware import request_id_of
from gateway.http.serve import resolver


async def model_metadata(request: web.Request) -> web.Response:
    model = resolver(request)(request.match_info["name"])
    version = request.match_info.get("version")
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    raw = await request.app[state.UPSTREAM].get(path, request_id=request_id_of(request))
    if raw.status == 404:
        what = f"version {version!r} of model {model!r}" if version else f"model {model!r}"
        raise ModelNotFound(f"{what} is not served here")
    if raw.status != 200:
        raise BadGateway(f"backend {raw.backend} answered {raw.status} to a metadata request")
    return web.Response(status=raw.status, body=raw.body, content_type="application/json")


async def server_ready(request: web.Request) -> web.Response:
    ready = request.app[state.ROUTER].ready()
    return web.Response(status=200 if ready else 503,
                        body=orjson.dumps({"ready": ready}), content_type="application/json")


async def server_live(request: web.Request) -> web.Response:
    return web.Response(body=b'{"live":true}', content_type="application/json")
