"""The cached routes' handlers: one per entry of the route registry (gateway/adapters/registry.py).

Each reads nothing itself: ``serve`` (gateway/http/serve.py) takes the tenant (401) before the
body is read, then the body (415, 413, 400), and calls the entry's parser (422) before any cache
or backend work; the one pipeline answers. OIP paths name their model (and maybe a version),
which must be served here (404 otherwise).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.adapters.registry import ROUTES, Parsing, Route
from gateway.errors import ModelNotFound
from gateway.http import app_state as state
from gateway.http.serve import resolver, serve


def _served_model(request: web.Request) -> str:
    """The backend model of the path; a version in the path must be the one served (else 404):
    answers of one version never stand in for another's."""
    model = resolver(request)(request.match_info["name"])
    version = request.match_info.get("version")
    if version is not None:
        served = request.app[state.ROUTER].model_version(model)
        if served is None or version != served:
            raise ModelNotFound(f"version {version!r} of model {model!r} is not served here"
                                + (f" (serving version {served!r})" if served else ""))
    return model


def parsing(request: web.Request) -> Parsing:
    """What the route's parser may use for this request."""
    app = request.app
    return Parsing(resolve=resolver(request), width=app[state.ROUTER].model_width,
                   fragments=app[state.FRAGMENTS],
                   path_model=_served_model(request) if "name" in request.match_info else None)


def handler(route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The POST handler of one cached route."""

    async def cached_route(request: web.Request) -> web.Response:
        return await serve(request, route.path, lambda data: route.parse(data, parsing(request)))

    return cached_route


def register(app: web.Application) -> None:
    """A POST route for every registry entry and each of its aliases."""
    for route in ROUTES:
        answer = handler(route)
        app.router.add_post(route.path, answer)
        for alias, _operation_id in route.aliases:
            app.router.add_post(alias, answer)
