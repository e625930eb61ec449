"""Middleware, outermost first: request context (id, access log, request metrics), then errors.

Every response says ``Server: edge-backend``, never the Python and aiohttp versions (what fails
before the middleware runs is answered by ``server.py`` the same way).

``errors`` renders every failure as JSON: the OIP spec's ``{"error": "<message>"}``, or on the
OpenAI-compatible ``/v1/`` routes OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
aiohttp's own HTTP errors (unknown route, wrong method, body too large) and unexpected
exceptions are converted here too, so the process keeps serving whatever a request held.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from backend.dataplane import SERVER_NAME
from backend.envelope import request_id
from backend.errors import BackendError
from backend.handlers import MODEL_LABEL, REQUEST_ID, json_response
from backend.logs import access_log, write_access_line
from backend.metrics import BackendMetrics

REQUEST_ID_HEADER = "X-Request-Id"
# Probes, scrapes and the gateways' metadata polls (GETs) log at DEBUG; inference at INFO.
_QUIET = ("/v2/health/", "/metrics")

log = logging.getLogger("backend.errors")


def request_context(*, metrics: BackendMetrics, log_requests: bool = True) -> Middleware:
    """Echoes (or assigns) ``X-Request-Id``, counts inference requests, logs one line each."""
    counted: dict[tuple[str, int], Any] = {}  # labels() costs a lock and a dict walk: once

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        rid = request_id(request.headers.get(REQUEST_ID_HEADER))
        request[REQUEST_ID] = rid
        response = await handler(request)
        headers = response.headers
        headers[REQUEST_ID_HEADER] = rid
        headers["Server"] = SERVER_NAME
        model = request.get(MODEL_LABEL)
        if model is not None:
            counter = counted.get((model, response.status))
            if counter is None:
                counter = metrics.requests.labels(model, str(response.status), "rest")
                counted[(model, response.status)] = counter
            counter.inc()
        if log_requests:
            # Probes and scrapes arrive every few seconds; keep them out of the INFO stream.
            quiet = request.path.startswith(_QUIET) or request.method == "GET"
            level = logging.DEBUG if quiet else logging.INFO
            if access_log.isEnabledFor(level):
                fields: dict[str, Any] = {
                    "request_id": rid, "method": request.method, "path": request.path,
                    "status": response.status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                }
                if model is not None:
                    fields["model"] = model
                write_access_line(level, fields)  # kept, written with others (logs.py)
        return response

    return middleware


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Renders ``BackendError``s, aiohttp HTTP errors and crashes as JSON errors."""
    try:
        return await handler(request)
    except BackendError as exc:
        return _render(request, exc.status, exc.message, exc.openai_type, exc.headers())
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects are answers, not errors
            raise
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        return _render(request, exc.status, message, kind, headers)
    except Exception as exc:
        log.error("unhandled error", exc_info=exc, extra={"fields": {
            "request_id": request.get(REQUEST_ID), "path": request.path}})
        return _render(request, 500, "internal error", "server_error", {})


def _render(request: web.Request, status: int, message: str, kind: str,
            headers: dict[str, str]) -> web.Response:
    body: dict[str, Any]
    if request.path.startswith("/v1/"):
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    else:
        body = {"error": message}
    return json_response(body, status=status, headers=headers)
