"""Liveness, readiness and the Prometheus scrape route."""

from __future__ import annotations

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import state


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    """Ready when the policy is loaded and at least one backend is ready."""
    backends = request.app[state.ROUTER].ready()
    policy = request.app[state.POLICIES].active
    ready = backends and policy is not None
    body = {"ready": ready, "backends_ready": backends,
            "policy_version": policy.version if policy is not None else None}
    return web.Response(status=200 if ready else 503, body=orjson.dumps(body),
                        content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[state.METRICS].registry
    return web.Response(body=generate_latest(registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})
