"""What every cached route does around the pipeline: tenant, deadline, cache directives and the
body first; the pipeline's answer with its headers last."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway import state
from gateway.context import CacheDirectives, RequestContext
from gateway.errors import ModelNotFound, ValidationFailed
from gateway.handlers.parsing import read_json
from gateway.middleware import TENANT, request_id_of
from gateway.pipeline import Call

# Request headers a policy may match on; others are not copied into the context.
_HEADER_SKIP = frozenset({"authorization", "cookie", "content-length", "content-type"})


def make_context(request: web.Request, route: str) -> RequestContext:
    """Tenant (401 for a bad key), deadline and cache directives: nothing reads the body."""
    settings = request.app[state.SETTINGS]
    tenant = request.app[state.TENANTS].identify(request.headers.get("Authorization"))
    request[TENANT] = tenant
    timeout_ms = float(settings.default_timeout_ms)
    raw = request.headers.get("X-Request-Timeout-Ms")
    if raw is not None:
        try:
            timeout_ms = float(raw)
        except ValueError:
            raise ValidationFailed("X-Request-Timeout-Ms", "must be a number of milliseconds") \
                from None
        if not 0 < timeout_ms <= settings.max_timeout_ms:
            raise ValidationFailed("X-Request-Timeout-Ms",
                                   f"must be between 1 and {settings.max_timeout_ms}")
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in _HEADER_SKIP}
    return RequestContext(
        request_id=request_id_of(request),
        route=route,
        tenant=tenant,
        headers=headers,
        deadline=time.monotonic() + timeout_ms / 1000.0,
        directives=CacheDirectives.parse(request.headers.get("Cache-Control")),
    )


async def begin(request: web.Request, route: str) -> tuple[RequestContext, dict[str, Any]]:
    """The context (authenticated before any work proportional to the body), then the body."""
    ctx = make_context(request, route)
    data = await read_json(request, request.app[state.SETTINGS].max_body_bytes)
    return ctx, data


async def answer(request: web.Request, ctx: RequestContext, call: Call) -> web.Response:
    """Run the pipeline for a parsed call and render its answer with the cache headers."""
    ctx.add_timing("parse", time.perf_counter() - ctx.started)
    result = await request.app[state.PIPELINE].run(ctx, call)
    body = call.render(result)
    return web.Response(body=body, content_type="application/json",
                        headers=cache_headers(ctx, result.age_s))


def resolver(request: web.Request) -> Callable[[str], str]:
    """Client model name -> backend model name, or 404 naming the models served."""
    settings = request.app[state.SETTINGS]

    def resolve(name: str) -> str:
        model = settings.resolve_model(name)
        if model is None:
            known = ", ".join(settings.models)
            raise ModelNotFound(f"model {name!r} is not served here (known: {known})")
        return model

    return resolve


def cache_headers(ctx: RequestContext, age_s: float) -> dict[str, str]:
    headers = {
        "X-Cache": ctx.cache_status or "BYPASS",
        "Server-Timing": ctx.server_timing(),
        "X-Request-Id": ctx.request_id,
    }
    if ctx.policy_tag:
        headers["X-Cache-Policy"] = ctx.policy_tag
    if ctx.cache_status in ("HIT", "STALE"):
        headers["Age"] = str(int(age_s))
    return headers
