"""The ops routes: the live dashboard, its stats JSON and the admin API.

``create_app`` calls ``register(app)`` once, after it has wired the metrics, router, policies
and cache. The admin routes exist only when an admin token is configured, so without one every
``/admin`` path is a plain 404; the dashboard is then open (the embedded local default) and
otherwise asks for the same token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.http import app_state as state
from gateway.http.routes import admin, dashboard
from gateway.http.stats import Stats
from gateway.telemetry.sampler import History


def register(app: web.Application) -> None:
    """Add ``/dashboard``, ``/dashboard/stats.json``, ``/dashboard/history.json`` and (with a
    token) ``/admin/...``."""
    if state.STATS not in app:
        app[state.STATS] = Stats(
            app[state.METRICS].registry, router=app[state.ROUTER], policies=app[state.POLICIES],
            redis=app[state.SETTINGS].redis.url is not None,
        )
    app.router.add_get("/dashboard", dashboard.page_handler(dashboard.load_page()))
    app.router.add_get("/dashboard/stats.json", dashboard.stats_json)
    if state.HISTORY not in app:
        app[state.HISTORY] = History.for_registry(app[state.METRICS].registry)
        app.cleanup_ctx.append(_sample_history)
    app.router.add_get("/dashboard/history.json", dashboard.history_json)
    if app[state.SETTINGS].admin_token:
        app.router.add_get("/admin/stats", admin.stats)
        app.router.add_post("/admin/purge", admin.purge)
        app.router.add_get("/admin/policies", admin.policies)
        app.router.add_post("/admin/policies/reload", admin.reload_policies)
        app.router.add_get("/admin/tenants", admin.tenants)
        app.router.add_post("/admin/tenants/reload", admin.reload_tenants)


async def _sample_history(app: web.Application) -> AsyncIterator[None]:
    history = app[state.HISTORY]
    history.start()
    try:
        yield
    finally:
        await history.stop()
