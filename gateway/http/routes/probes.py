"""Liveness, readiness and the Prometheus scrape route.

``/metrics`` labels name tenants, so it can be closed: with ``metrics_token`` set, a scrape must
send ``Authorization: Bearer <token>`` (compared in constant time, as the admin token is) and
anything else is a 401 in the gateway's error shape. Without it the route is open, which is what
a default Prometheus scrape config expects.
"""

from __future__ import annotations

import hmac
import os

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import Unauthorized
from gateway.http import app_state as state
from gateway.http.routes.admin import presented_token


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    """Ready when the policy is loaded and at least one backend is ready. Names the policy's
    version and where it came from (``policy_source``: the configured path, or ``built-in``),
    and the worker that answered (``worker_pid``: each worker of a gateway answers for itself)."""
    backends = request.app[state.ROUTER].ready()
    policies = request.app[state.POLICIES]
    policy = policies.active
    ready = backends and policy is not None
    body = {"ready": ready, "backends_ready": backends,
            "policy_version": policy.version if policy is not None else None,
            "policy_source": policies.origin, "worker_pid": os.getpid()}
    return web.Response(status=200 if ready else 503, body=orjson.dumps(body),
                        content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    """The Prometheus text format, all workers' series (behind ``metrics_token`` when set)."""
    expected = request.app[state.SETTINGS].metrics_token
    if expected is not None:
        token = presented_token(request)
        # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail.
        if token is None or not hmac.compare_digest(token.encode("utf-8", "surrogateescape"),
                                                    expected.encode("utf-8")):
            raise Unauthorized("a valid metrics token is required (Authorization: Bearer <token>)")
    registry = request.app[state.METRICS].registry
    return web.Response(body=generate_latest(registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})
