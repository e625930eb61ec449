"""Middleware, outermost first: request id and error rendering, then access log and metrics.

Every error leaves as ``{"error": {"type", "message", "request_id"}}`` with the status its class
carries; anything unexpected is logged with its traceback and answered 500 without internals.
Errors whose detail stays internal (a backend's address) are answered with their public message
and the detail is logged at WARNING with the request id. Every response says ``Server:
edge-gateway``, never the Python and aiohttp versions.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from gateway.errors import (
    GatewayError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    http_error_class,
)
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.observer import Observer
from gateway.tenants.quota.limiter import QuotaState

log = logging.getLogger("gateway.access")
error_log = logging.getLogger("gateway.errors")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
QUOTA: web.RequestKey[QuotaState] = web.RequestKey("quota", QuotaState)
"""The request's quota state, when its tenant has limits (for the RateLimit headers: the
handler puts them on its answer, ``errors`` on an error's)."""
ARRIVED: web.RequestKey[float] = web.RequestKey("arrived", float)
"""When the request's head was read off its connection (``time.monotonic``), set by the
connection's protocol (http/connection.py): its deadline counts from then, not from when its
handler ran."""
# Probes and scrapes would drown the access log; they are counted in metrics instead.
_QUIET = frozenset({"/metrics", "/healthz", "/readyz", "/dashboard/stats.json"})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
SERVER_NAME = "edge-gateway"
"""The ``Server`` header of every response: a product name, no versions to fingerprint."""


def request_id_of(request: web.Request) -> str:
    rid: str = request.get(REQUEST_ID, "")
    return rid


_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count(int.from_bytes(os.urandom(4), "big"))


def new_request_id() -> str:
    """A fresh request id, 32 hex characters: 64 random bits chosen once per process, then a
    64-bit counter (unique without a system call per request)."""
    return f"{_ID_PREFIX}{next(_ids):016x}"


def request_id_for(incoming: str) -> str:
    """The request's id: the client's ``X-Request-Id`` when it is a safe one (letters, digits,
    ``._:-``, 1-128 of them), else a new one."""
    return incoming if incoming and _SAFE_ID.match(incoming) else new_request_id()


def error_response(exc: GatewayError, request_id: str) -> web.Response:
    """The one JSON error shape, with the error's public message and headers."""
    body = {"error": {"type": exc.type, "message": exc.public_message,
                      "request_id": request_id}}
    headers = {"X-Request-Id": request_id, "Server": SERVER_NAME, **exc.headers()}
    return web.Response(status=exc.status, body=orjson.dumps(body),
                        content_type="application/json", headers=headers)


def _from_http_exception(exc: web.HTTPException) -> GatewayError:
    if exc.status == 404:
        return NotFound("no such route")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(exc.allowed_methods)
        return MethodNotAllowed(
            f"method {exc.method} is not allowed on this route; it takes {', '.join(allowed)}",
            allowed=allowed)
    if exc.status == 413:
        return PayloadTooLarge("request body too large")
    return http_error_class(exc.status)(exc.reason)


def make_error_middleware(observer: Observer, access_log: AccessLog,
                          ) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Assign the request id, render every error as JSON, log and count each request."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        incoming = request.headers.get("X-Request-Id", "")
        rid = request_id_for(incoming)
        request[REQUEST_ID] = rid
        t0 = time.perf_counter()
        route = _route_label(request)
        failed = True
        try:
            response = await handler(request)
            failed = False
        except GatewayError as exc:
            if exc.public_message != exc.message:
                # The client got the public words; the detail (which backend, its status and
                # error message, which names fields, never texts) is for operators.
                error_log.warning("upstream error", extra={
                    "request_id": rid, "route": route, "status": exc.status,
                    "error": exc.type, "detail": exc.message})
            response = error_response(exc, rid)
        except web.HTTPException as exc:
            response = error_response(_from_http_exception(exc), rid)
        except Exception:
            log.exception("unhandled error", extra={"request_id": rid, "route": route})
            response = error_response(GatewayError("internal error"), rid)
        headers = response.headers
        if failed:  # a limited tenant's error answers carry its RateLimit headers too
            quota = request.get(QUOTA)
            if quota is not None:
                headers.update(quota.headers())
        cache = headers.get("X-Cache", "NONE")
        elapsed = time.perf_counter() - t0
        if route != "/metrics":
            observer.request_done(route, response.status, cache, elapsed)
        if "X-Request-Id" not in headers:
            headers["X-Request-Id"] = rid
        headers["Server"] = SERVER_NAME
        if route not in _QUIET:
            access_log.record(rid, request.method, route, response.status, cache,
                              request.get(TENANT, ""), elapsed * 1000.0,
                              headers.get("Server-Timing", ""))
        return response

    return errors


_LABELS: dict[object, str] = {}  # route -> its label (routes live as long as their app)


def _route_label(request: web.Request) -> str:
    """The route pattern, not the raw path: bounded label cardinality, no ids in metrics."""
    info = request.match_info
    route = info.route if info is not None else None
    label = _LABELS.get(route)
    if label is None:
        resource = route.resource if route is not None else None
        if resource is None:  # a 404/405 (a new system route each time): not kept
            return "unmatched"
        label = resource.canonical
        if len(_LABELS) >= 4096:  # apps made and dropped (tests): start over
            _LABELS.clear()
        _LABELS[route] = label
    return label
