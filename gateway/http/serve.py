"""What every cached route does around the pipeline: tenant, quota, deadline, cache directives
and the body first; the pipeline's answer with its headers last; the tenant's accounting."""

from __future__ import annotations

import asyncio
import math
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
from gateway.http.body import check_json_type, parse_json, read_body, timeout_ms_of
from gateway.http.middleware import ARRIVED, QUOTA, TENANT, request_id_of
from gateway.pipeline import Call
from gateway.pipeline.accounting import usage_of
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.pipeline.hot_answers import HotAnswer, HotAnswers
from gateway.policy.headers import RequestHeaders
from gateway.tenants.quota.limiter import QuotaState


def make_context(request: web.Request, route: str, *, tenant: str | None = None,
                 started: float | None = None,
                 headers: RequestHeaders | None = None) -> RequestContext:
    """Tenant (401 for a bad key, unless already identified), deadline (counted from when the
    request's head was read, ``ARRIVED``) and cache directives: nothing here reads the body.
    ``headers``: the request's one reading of its headers, when the caller already made it
    (the hot-answer key reads the same one)."""
    settings = request.app[state.SETTINGS]
    if tenant is None:
        tenant = identify(request)
    if headers is None:
        headers = RequestHeaders.of(request.headers)
    timeout_ms = timeout_ms_of(headers.values_of("x-request-timeout-ms"),
                               default_ms=settings.default_timeout_ms,
                               max_ms=settings.max_timeout_ms)
    ctx = RequestContext(
        request_id=request_id_of(request),
        route=route,
        tenant=tenant,
        headers=headers,
        deadline=(request.get(ARRIVED) or time.monotonic()) + timeout_ms / 1000.0,
        directives=CacheDirectives.parse(headers.joined("cache-control")),
    )
    if started is not None:
        ctx.started = started
    return ctx



def identify(request: web.Request, app: web.Application | None = None) -> str:
    """The request's tenant (401 for a missing or unknown key when tenants are configured)."""
    app = request.app if app is None else app
    tenant = app[state.TENANTS].identify(request.headers.get("Authorization"))
    request[TENANT] = tenant
    return tenant


async def serve(request: web.Request, route: str,
                parse: Callable[[dict[str, Any]], Call]) -> web.Response:
    """The whole request path of every cached route, in order. Each stage is one line here and
    lives in its own module; the route's adapter is entered twice, to parse and to render.

    tenant -> quota -> body -> hot answer -> parse -> early refusal -> policy -> units and keys
    -> lookup -> charge -> admission and fetch, store -> render

    The early refusal: while the tenant's last call had to queue, admission judges this one
    at once in that tier (upstream/admission/control.py ``refuse_early``), so a tenant past
    its wait bound or its deadline is told before the policy, keys and lookups (a hit that is
    not a hot answer included); refusals for its backlog are held (``hold``). Most such
    requests never get here: the connection's protocol refuses them as they are read
    (http/gate.py, ``admission.refuse_at_read``); what it leaves to the app is judged here.

    The tenant's request is counted by outcome (ok, rate_limited, shed, error)."""
    started = time.perf_counter()
    app = request.app
    tenant = identify(request, app)  # tenants/ (401), before any work proportional to the body
    outcome = "error"
    ctx: RequestContext | None = None
    try:
        quota = app[state.QUOTAS].state(tenant)  # tenants/quota/: the request rate (429)
        if quota is not None:
            await admit(request, quota)
        check_json_type(request)  # http/body.py (415)
        body = await read_body(request, app[state.SETTINGS].max_body_bytes)  # (413, 400)
        headers = RequestHeaders.of(request.headers)  # policy/headers.py: the one reading
        answers = app[state.HOT]
        hot_key = hot_key_of(request, answers, tenant, headers, body)  # pipeline/hot_answers.py
        hot = answers.get(hot_key) if hot_key is not None else None
        if hot is not None:
            if quota is not None:  # every text a hit
                await quota.charge(0, len(hot[0].entries))
            outcome = "hot"  # counted with the answer's record (``hot_answered``)
            return hot_response(request, answers, hot, tenant, started, quota)
        ctx = make_context(request, route, tenant=tenant, started=started, headers=headers)
        if quota is not None:
            ctx.charge = quota.charge
        call = parse(parse_json(body))  # adapters/: parse (400, 404, 422)
        refusal = app[state.ADMISSION].refuse_early(tenant, ctx.deadline)  # upstream/admission/
        if refusal is not None:  # the tenant's backlog: refused before the policy and lookups
            app[state.OBSERVER].shed(refusal.reason)
            raise refusal
        ctx.add_timing("parse", time.perf_counter() - started)
        pipeline = app[state.PIPELINE]  # pipeline/core.py: the stages between parse and render
        decision = pipeline.decide(ctx, call)  # policy/ (422 when a rule rejects)
        plan = pipeline.plan(ctx, call, decision)  # pipeline/units.py, cache/keys.py
        await pipeline.lookup(ctx, call, plan)  # cache/: L1, node tier, Redis
        await pipeline.charge(ctx, plan)  # tenants/quota/: texts, hits told from misses (429)
        await pipeline.fetch_and_store(ctx, call, plan)  # upstream/ (503, 504, 502); store
        result = pipeline.finish(ctx, call, plan)
        rendered = call.render(result)  # adapters/: render
        app[state.OBSERVER].tenant_usage(tenant, usage_of(result.outcomes,
                                                          ctx.timings.get("compute", 0.0)))
        if hot_key is not None:
            app[state.HOT].put(hot_key, call.model, result, rendered)
        outcome = "ok"
        answer_headers = cache_headers(ctx, result.age_s)
        if quota is not None:
            answer_headers.update(quota.headers())
        return web.Response(body=rendered, content_type="application/json",
                            headers=answer_headers)
    except RateLimited:
        outcome = "rate_limited"
        raise
    except Overloaded as exc:
        outcome = "shed"
        if exc.reason in HELD:
            await hold(exc, app[state.SETTINGS].admission.refusal_hold_s,
                       None if ctx is None else ctx.time_left())
        raise
    except DeadlineExceeded:
        outcome = "shed"
        raise
    finally:
        if outcome != "hot":
            app[state.OBSERVER].tenant_request(tenant, outcome)


HELD = frozenset({"wait", "queue_full"})
"""Refusals for the tenant's own backlog, which ``hold`` delays; never one for the request's
deadline, which is told at once."""


HOLD_SHARE = 0.05
"""A refusal is held at most this share of the time its request had left: a client that set a
short deadline (``X-Request-Timeout-Ms``) is told early enough to go elsewhere."""


async def hold(refusal: Overloaded, hold_s: float, time_left_s: float | None = None) -> None:
    """Hold a backlog refusal as ``hold_for`` says."""
    pause = hold_for(refusal, hold_s, time_left_s)
    if pause > 0:
        await asyncio.sleep(pause)


def hold_for(refusal: Overloaded, hold_s: float, time_left_s: float | None = None) -> float:
    """How long to hold a backlog refusal: ``hold_s`` (``admission.refusal_hold_s``), but not
    past the ``Retry-After`` it carries (whole seconds, at least 1), which this shortens by
    the hold, nor past ``HOLD_SHARE`` of ``time_left_s`` (the request's deadline): a client
    that resends at once cannot spin the core on refusals, and one with a short deadline
    still hears in time."""
    pause = min(hold_s, max(1.0, math.ceil(refusal.retry_after_s)))
    if time_left_s is not None:
        pause = min(pause, HOLD_SHARE * max(0.0, time_left_s))
    if pause > 0:
        refusal.retry_after_s = max(0.0, refusal.retry_after_s - pause)
    return pause


async def admit(request: web.Request, quota: QuotaState) -> None:
    """The tenant's request-rate limit (429); its state is kept for the RateLimit headers and
    for the text charge after the lookup."""
    request[QUOTA] = quota
    await quota.admit()


def hot_key_of(request: web.Request, answers: HotAnswers, tenant: str,
               headers: RequestHeaders, body: bytes) -> bytes | None:
    """The request's hot-answer key, or None when it must take the full path (Cache-Control
    or a deadline of its own, or whatever ``HotAnswers.key`` refuses)."""
    raw = request.headers  # neither name is hidden from the policy: the raw headers tell
    if "cache-control" in raw or "x-request-timeout-ms" in raw:
        return None
    return answers.key(request.path, tenant, headers, body)


def hot_response(request: web.Request, answers: HotAnswers,
                 found: tuple[HotAnswer, float, int], tenant: str, started: float,
                 quota: QuotaState | None) -> web.Response:
    """A repeat answered from its rendered body: ``HotAnswers.get`` found it while the policy
    version, the header reading and every entry (fresh under the current TTL) still hold."""
    answer, age, from_node = found
    answers.observe(answer, tenant, from_node)  # its usage and request too
    total = f"{(time.perf_counter() - started) * 1000.0:.3f}"
    headers = {"X-Cache": "HIT", "Server-Timing": f"hot;dur={total}, total;dur={total}",
               "X-Request-Id": request_id_of(request), "X-Cache-Policy": answer.trail,
               "Age": str(int(age))}
    if quota is not None:
        headers.update(quota.headers())
    return web.Response(body=answer.body, content_type="application/json", headers=headers)


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
