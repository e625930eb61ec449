"""``GET /dashboard`` (the live ops page), ``GET /dashboard/stats.json`` (the data it polls) and
``GET /dashboard/history.json`` (the host's last minutes, drawn at once when the page opens).

The page is one static file with its script and style inline and no outside assets, so it works
on an air-gapped network. Its Content-Security-Policy allows exactly those inline blocks (by
hash) and requests to this gateway, nothing else.

Both routes show tenant ids, so when an admin token is configured they require it, as an
``Authorization: Bearer`` header or a ``?token=`` parameter (a browser cannot set headers when
opening a page; the page moves the token into ``sessionStorage`` and sends it as a header).
Without an admin token (the embedded local default) they are open.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from aiohttp import web

from gateway.errors import ValidationFailed
from gateway.http import app_state as state
from gateway.http.routes.admin import authorize

Handler = Callable[[web.Request], Awaitable[web.Response]]
_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)
_NO_STORE = {"Cache-Control": "no-store"}


def load_page() -> bytes:
    """The dashboard HTML shipped in the package (``gateway/http/static/dashboard.html``)."""
    # Beside the package's modules (package data), not importlib.resources: editable installs
    # on Python 3.11 give gateway a search path that the resources API rejects.
    return (Path(__file__).resolve().parent.parent / "static" / "dashboard.html").read_bytes()


def content_security_policy(html: bytes) -> str:
    """A CSP that allows the page's own inline script and style blocks (by hash) and no more."""
    sources: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for match in _INLINE.finditer(html):
        digest = base64.b64encode(hashlib.sha256(match.group(2)).digest()).decode()
        sources[match.group(1)].append(f"'sha256-{digest}'")
    scripts = " ".join(sources[b"script"]) or "'none'"
    styles = " ".join(sources[b"style"]) or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def page_handler(html: bytes) -> Handler:
    """The ``GET /dashboard`` handler serving ``html``."""
    headers = {
        **_NO_STORE,
        "Content-Security-Policy": content_security_policy(html),
        # The token may arrive in the query string: never pass the address on.
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
    }

    async def dashboard(request: web.Request) -> web.Response:
        authorize(request, allow_query=True)
        return web.Response(body=html, content_type="text/html", charset="utf-8",
                            headers=headers)

    return dashboard


async def stats_json(request: web.Request) -> web.Response:
    """The stats snapshot the page polls (the same JSON as ``GET /admin/stats``)."""
    authorize(request, allow_query=True)
    body = orjson.dumps(request.app[state.STATS].snapshot())
    return web.Response(body=body, content_type="application/json", headers=_NO_STORE)


async def history_json(request: web.Request) -> web.Response:
    """The host's history: ``{"interval_s", "window_s", "sampler_pid", "points"}``.

    ``?since=<epoch seconds>`` answers only the points after that time (the page asks for the
    whole window once, then for what is new on every poll). Point fields:
    gateway/telemetry/history.py.
    """
    authorize(request, allow_query=True)
    raw = request.query.get("since", "0")
    try:
        since = float(raw)
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        raise ValidationFailed("since", "must be a time in seconds since the epoch, e.g. "
                               "the t of the last point seen")
    history = request.app[state.HISTORY]
    body = orjson.dumps({
        "interval_s": history.interval_s,
        "window_s": history.window_s,
        "sampler_pid": history.sampler_pid(),
        "points": await history.points(since),
    })
    return web.Response(body=body, content_type="application/json", headers=_NO_STORE)
