"""Admin API: stats, cache purge (by model, tenant or key), policy reload and the active policy,
tenants (quotas, weights, usage) and their reload.

Only registered when an admin token is configured (``admin_token``, ``GATEWAY_ADMIN_TOKEN``);
without one every ``/admin`` path is an unknown route (404). Callers send
``Authorization: Bearer <token>``; it is compared in constant time and a missing or wrong token
is a 401 in the gateway's one error shape.

Every call, refused ones included, is logged on ``gateway.admin`` with who (remote address and a
short SHA-256 fingerprint of the token presented, never the token) and what (route, parameters,
status). Request texts never reach these routes, so none can be logged.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.cache.base import CacheUnavailable
from gateway.cache.keys import CacheKey
from gateway.errors import BadRequest, GatewayError, Unauthorized, ValidationFailed
from gateway.http import app_state as state
from gateway.http.middleware import request_id_of
from gateway.http.stats import tenant_usage
from gateway.policy.loader import PolicyError
from gateway.policy.model import SHARED_SCOPE, Policy
from gateway.telemetry.samples import Samples
from gateway.tenants.directory import TenantsError
from gateway.tenants.quota.spec import TenantSpec

log = logging.getLogger("gateway.admin")

Params = dict[str, Any]
AdminHandler = Callable[[web.Request, Params], Awaitable[web.Response]]
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")
_PURGE_FIELDS = frozenset({"model", "tenant", "shared", "key", "all"})


class CacheBusy(GatewayError):
    """The cache could not complete an admin operation (Redis down); nothing was claimed done."""

    status = 503
    type = "cache_unavailable"


def presented_token(request: web.Request, *, allow_query: bool = False) -> str | None:
    """The bearer token of the request (or its ``?token=`` when ``allow_query``), if any."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if allow_query:
        return request.query.get("token") or None
    return None


def fingerprint(token: str | None) -> str:
    """Who called, for logs: 12 hex chars of the token's SHA-256 (``-`` for no token)."""
    if not token:
        return "-"
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def authorize(request: web.Request, *, allow_query: bool = False) -> None:
    """Raise ``Unauthorized`` unless the request carries the admin token (open without one)."""
    expected = request.app[state.SETTINGS].admin_token
    if not expected:
        return
    token = presented_token(request, allow_query=allow_query)
    # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail (500).
    if token is None or not hmac.compare_digest(token.encode("utf-8", "surrogateescape"),
                                                expected.encode("utf-8")):
        raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)")


def admin_route(handler: AdminHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Wrap an admin handler: check the token, then log who did what and how it ended."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.Response:
        params: Params = {}
        status = 500
        try:
            authorize(request)
            response = await handler(request, params)
            status = response.status
            return response
        except GatewayError as exc:
            status = exc.status
            raise
        finally:
            log.log(
                logging.WARNING if status in (401, 403) or status >= 500 else logging.INFO,
                "admin call",
                extra={
                    "request_id": request_id_of(request),
                    "remote": request.remote,
                    "token_fp": fingerprint(presented_token(request)),
                    "method": request.method,
                    "admin_route": request.path,
                    "params": params,
                    "status": status,
                },
            )

    return wrapped


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValidationFailed("body", "must be a JSON object")
    return data


@admin_route
async def stats(request: web.Request, params: Params) -> web.Response:
    """``GET /admin/stats``: the stats snapshot (see ``gateway.http.stats``)."""
    return _json(request.app[state.STATS].snapshot())


def _purge_target(body: dict[str, Any], request: web.Request) -> tuple[str | None, str | None]:
    """The ``(model, scope)`` a purge body names, validated."""
    unknown = sorted(set(body) - _PURGE_FIELDS)
    if unknown:
        raise ValidationFailed(unknown[0], "unknown field (model, tenant, shared, key, all)")
    for name in ("model", "tenant", "key"):
        if name in body and (not isinstance(body[name], str) or not body[name]):
            raise ValidationFailed(name, "must be a non-empty string")
    for name in ("shared", "all"):
        if name in body and not isinstance(body[name], bool):
            raise ValidationFailed(name, "must be true or false")
    model: str | None = None
    if "model" in body:
        model = request.app[state.SETTINGS].resolve_model(body["model"])
        if model is None:
            raise ValidationFailed("model", f"model {body['model']!r} is not served here")
    if body.get("shared") and "tenant" in body:
        raise ValidationFailed("shared", "name a tenant or shared, not both")
    scope = SHARED_SCOPE if body.get("shared") else body.get("tenant")
    if model is None and scope is None and "key" not in body and body.get("all") is not True:
        # Never wipe everything by accident (an empty or mistyped body).
        raise ValidationFailed("body", 'name a model, tenant, shared or key (or "all": true)')
    return model, scope


@admin_route
async def purge(request: web.Request, params: Params) -> web.Response:
    """``POST /admin/purge``: remove entries from L1 and L2.

    ``{"model"?, "tenant"? | "shared": true}`` purges everything matching (``{"all": true}``
    purges the lot); ``{"key": "<32 hex>", "model", "tenant" | "shared": true}`` deletes one
    entry. Answers ``{"purged": n}``. Other replicas' in-process caches are not reached.
    """
    body = await _body(request)
    params.update({k: v for k, v in body.items() if k in _PURGE_FIELDS})
    model, scope = _purge_target(body, request)
    cache = request.app[state.CACHE]
    if "key" in body:
        key = str(body["key"])
        if not _HEX32.match(key):
            raise ValidationFailed("key", "must be 32 hex characters (a cache key digest)")
        if model is None or scope is None:
            raise ValidationFailed("key", "a key also needs its model and tenant (or shared)")
        purged = await cache.delete_many([CacheKey(model, scope, bytes.fromhex(key))])
    else:
        try:
            purged = await cache.purge(model=model, scope=scope)
        except CacheUnavailable as exc:
            raise CacheBusy(f"purge incomplete: {exc}") from None
    params["purged"] = purged
    return _json({"purged": purged})


def _describe(policy: Policy) -> dict[str, Any]:
    return {
        "version": policy.version,
        "sources": list(policy.sources),
        "rules": [rule.name for rule in policy.rules],
    }


@admin_route
async def policies(request: web.Request, params: Params) -> web.Response:
    """``GET /admin/policies``: the active policy (version, sources, rules) and the shadow one."""
    store = request.app[state.POLICIES]
    shadow = store.shadow
    return _json({**_describe(store.active),
                  "shadow": _describe(shadow) if shadow is not None else None})


@admin_route
async def reload_policies(request: web.Request, params: Params) -> web.Response:
    """``POST /admin/policies/reload``: 200 with the new version, or 422 naming each error.

    An invalid policy is refused whole; the last good one stays active.
    """
    store = request.app[state.POLICIES]
    try:
        await store.reload()
    except PolicyError as exc:
        errors = [{"file": e.file, "line": e.line, "field": e.field, "message": e.message,
                   "severity": e.severity} for e in exc.errors]
        params["errors"] = len(errors)
        return _json({"error": {
            "type": "policy_invalid",
            "message": f"policy refused ({len(errors)} error(s)); the last good policy stays",
            "request_id": request_id_of(request),
            "errors": errors,
            "active_version": store.active.version,
        }}, status=422)
    version = store.active.version
    params["version"] = version
    return _json({"reloaded": True, "version": version})


def _spec(spec: TenantSpec) -> dict[str, Any]:
    return {"weight": spec.weight, "priority": spec.priority,
            "quota": dataclasses.asdict(spec.quota)}


@admin_route
async def tenants(request: web.Request, params: Params) -> web.Response:
    """``GET /admin/tenants``: each tenant's quota, weight and class (never its keys), the
    defaults, how quotas are enforced now, and usage per tenant label (the busiest
    ``quotas.top_tenants`` tenants by name, the rest as ``other``)."""
    app = request.app
    store, gate = app[state.TENANTS], app[state.QUOTAS]
    current = store.current
    shared = gate.shared
    usage = tenant_usage(Samples(app[state.METRICS].registry))
    return _json({
        "file": str(store.path) if store.path is not None else None,
        "quotas": {"enabled": gate.settings.enabled, "hit_cost": gate.settings.hit_cost,
                   "shared": shared is not None,
                   "redis_reachable": None if shared is None else not shared.breaker.is_open},
        "defaults": _spec(current.default),
        "tenants": {t: {**_spec(current.spec(t)), "usage_label": (
            t if t in usage else "other")} for t in sorted(current.names)},
        "usage": usage,
    })


@admin_route
async def reload_tenants(request: web.Request, params: Params) -> web.Response:
    """``POST /admin/tenants/reload``: 200 with the tenant count, or 422 listing each problem
    (``file:line: field: message``); an invalid file is refused whole, the last good one stays.
    """
    store = request.app[state.TENANTS]
    try:
        current = await store.reload()
    except TenantsError as exc:
        problems = str(exc).splitlines()
        params["errors"] = len(problems)
        return _json({"error": {
            "type": "tenants_invalid",
            "message": f"tenants file refused ({len(problems)} problem(s)); the last good "
                       "one stays",
            "request_id": request_id_of(request),
            "errors": problems,
        }}, status=422)
    params["tenants"] = len(current.names)
    return _json({"reloaded": store.path is not None, "tenants": len(current.names)})
