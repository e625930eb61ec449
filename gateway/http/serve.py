"""What every cached route does around the pipeline: tenant, quota, deadline, cache directives
and the body first; the pipeline's answer with its headers last; the tenant's accounting."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.errors import (
    DeadlineExceeded,
    ModelNotFound,
    Overloaded,
    RateLimited,
)
from gateway.http import app_state as state
from gateway.http.body import check_json_type, deadline_ms, parse_json, read_body
from gateway.http.middleware import TENANT, request_id_of
from gateway.pipeline import Call
from gateway.pipeline.accounting import hot_usage, usage_of
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.policy.headers import RequestHeaders
from gateway.tenants.quota.limiter import QuotaState

QUOTA: web.RequestKey[QuotaState] = web.RequestKey("quota", QuotaState)
"""The request's quota state, when its tenant has limits (for the RateLimit headers)."""


def make_context(request: web.Request, route: str, *, tenant: str | None = None,
                 started: float | None = None,
                 headers: RequestHeaders | None = None) -> RequestContext:
    """Tenant (401 for a bad key, unless already identified), deadline and cache directives:
    nothing here reads the body. ``headers``: the request's one reading of its headers, when
    the caller already made it (the hot-answer key reads the same one)."""
    settings = request.app[state.SETTINGS]
    if tenant is None:
        tenant = identify(request)
    if headers is None:
        headers = RequestHeaders.of(request.headers)
    # Sent more than once: every value must be valid (400 otherwise), and the strictest applies.
    asked = [deadline_ms(raw, default_ms=settings.default_timeout_ms,
                         max_ms=settings.max_timeout_ms)
             for raw in headers.values_of("x-request-timeout-ms")]
    timeout_ms = min(asked) if asked else float(settings.default_timeout_ms)
    ctx = RequestContext(
        request_id=request_id_of(request),
        route=route,
        tenant=tenant,
        headers=headers,
        deadline=time.monotonic() + timeout_ms / 1000.0,
        directives=CacheDirectives.parse(headers.joined("cache-control")),
    )
    if started is not None:
        ctx.started = started
    return ctx



def identify(request: web.Request) -> str:
    """The request's tenant (401 for a missing or unknown key when tenants are configured)."""
    tenant = request.app[state.TENANTS].identify(request.headers.get("Authorization"))
    request[TENANT] = tenant
    return tenant


async def serve(request: web.Request, route: str,
                parse: Callable[[dict[str, Any]], Call]) -> web.Response:
    """One cached route's request: authenticate (before any work proportional to the body),
    check the tenant's request rate, then answer; the tenant's request counted by outcome."""
    started = time.perf_counter()
    tenant = identify(request)
    outcome = "error"
    try:
        response = await _answer(request, route, parse, tenant, started)
        outcome = "ok"
        return response
    except RateLimited:
        outcome = "rate_limited"
        raise
    except (Overloaded, DeadlineExceeded):
        outcome = "shed"
        raise
    finally:
        request.app[state.OBSERVER].tenant_request(tenant, outcome)


async def _answer(request: web.Request, route: str, parse: Callable[[dict[str, Any]], Call],
                  tenant: str, started: float) -> web.Response:
    """Read the body, answer a hot repeat at once (gateway/pipeline/hot_answers.py), else parse, run
    the pipeline
    (which charges the tenant's texts once hits are told from misses) and render."""
    app = request.app
    quota = app[state.QUOTAS].state(tenant)
    if quota is not None:
        request[QUOTA] = quota
        await quota.admit()
    check_json_type(request)
    body = await read_body(request, app[state.SETTINGS].max_body_bytes)
    hot = app[state.HOT]
    headers = RequestHeaders.of(request.headers)  # the one reading: hot key, policy, directives
    hot_key = None
    if "cache-control" not in headers and "x-request-timeout-ms" not in headers:
        hot_key = hot.key(request.path, tenant, headers, body)
        found = hot.get(hot_key) if hot_key is not None else None
        if found is not None:
            answer, age, from_node = found
            if quota is not None:
                await quota.charge(0, len(answer.entries))
            hot.observe(answer, tenant, from_node)
            app[state.OBSERVER].tenant_usage(tenant, hot_usage(answer.entries))
            total = (time.perf_counter() - started) * 1000.0
            return web.Response(body=answer.body, content_type="application/json", headers={
                "X-Cache": "HIT", "Server-Timing": f"hot;dur={total:.3f}, total;dur={total:.3f}",
                "X-Request-Id": request_id_of(request), "X-Cache-Policy": answer.decision.trail,
                "Age": str(int(age))})
    ctx = make_context(request, route, tenant=tenant, started=started, headers=headers)
    if quota is not None:
        ctx.charge = quota.charge
    call = parse(parse_json(body))
    ctx.add_timing("parse", time.perf_counter() - started)
    result = await app[state.PIPELINE].run(ctx, call)
    app[state.OBSERVER].tenant_usage(tenant, usage_of(result.outcomes,
                                                      ctx.timings.get("compute", 0.0)))
    rendered = call.render(result)
    if hot_key is not None:
        hot.put(hot_key, call.model, result, rendered)
    return web.Response(body=rendered, content_type="application/json",
                        headers=cache_headers(ctx, result.age_s))


async def rate_limit_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: a limited tenant's ``RateLimit-Policy`` and ``RateLimit`` on
    every answer of its request, errors (429, 503...) included."""
    quota = request.get(QUOTA)
    if quota is not None:
        response.headers.update(quota.headers())


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
