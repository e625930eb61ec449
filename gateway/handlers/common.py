"""What every inference handler does first: tenant, deadline, cache directives, model name."""

from __future__ import annotations

import time

from aiohttp import web

from gateway import state
from gateway.context import CacheDirectives, RequestContext
from gateway.errors import ModelNotFound, ValidationFailed
from gateway.middleware import TENANT, request_id_of

# Request headers a policy may match on; others are not copied into the context.
_HEADER_SKIP = frozenset({"authorization", "cookie", "content-length", "content-type"})


def make_context(request: web.Request, route: str) -> RequestContext:
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


def resolve_model(request: web.Request, name: str) -> str:
    model = request.app[state.SETTINGS].resolve_model(name)
    if model is None:
        known = ", ".join(request.app[state.SETTINGS].models)
        raise ModelNotFound(f"model {name!r} is not served here (known: {known})")
    return model


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
