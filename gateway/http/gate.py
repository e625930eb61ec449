"""Refusals judged as a request's head is read, before aiohttp builds a request for it.

Under overload most requests are refused, and on a core the model shares each refusal's CPU
comes out of the answers. Through the app a refusal costs ~445k instructions (aiohttp's own
request and response machinery alone ~220k: the floor of any request there); answered here
from the head aiohttp's parser already made, 155-174k (bench/RESULTS.md, "A refusal as the
head is read").

``ReadGate.judge`` is asked by the connection's protocol (http/connection.py) for a complete
request (head and body read) arriving on an idle keep-alive HTTP/1.1 connection, only while
admission holds a tenant's backlog (``Admission.backlogged``; otherwise one attribute read):
a POST to a cached route, of a known tenant, whose deadline header (if any) is valid, that
``Admission.refuse_early`` would refuse now. Its answer is the one the app would give (the
JSON error shape, ``Retry-After``, ``X-Request-Id``, ``Server``), held as the app holds it
(``serve.hold_for``), counted as the app counts it (shed reason, the tenant's ``shed``
request, the route's request metrics, the access line). Anything else takes the full path:
a request that needs a 401, 400 or any other answer the app gives gets it there.

What a refused tenant sees change: its repeats that the hot-answer cache would have answered
are refused too, and so are bodies the app would have answered 4xx (as its request-rate limit
is judged before them). ``admission.refuse_at_read: false`` keeps the full path for them.
"""

from __future__ import annotations

import re
import time

from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from multidict import istr

from gateway.adapters.registry import ROUTES
from gateway.errors import GatewayError
from gateway.http import app_state as state
from gateway.http.body import is_json_type, timeout_ms_of
from gateway.http.connection import raw_error
from gateway.http.middleware import request_id_for
from gateway.http.serve import HELD, hold_for

_AUTHORIZATION = istr("Authorization")
_DEADLINE = istr("X-Request-Timeout-Ms")
_REQUEST_ID = istr("X-Request-Id")
_CONTENT_TYPE = istr("Content-Type")
_EXPECT = istr("Expect")


class CachedRoutes:
    """The cached routes' paths (aliases too), each with its metric label (its pattern):
    exact paths, and patterns for those with ``{name}`` parts (aiohttp's default part,
    ``[^{}/]+``)."""

    __slots__ = ("_exact", "_patterns")

    def __init__(self) -> None:
        self._exact: dict[str, str] = {}
        self._patterns: list[tuple[re.Pattern[str], str]] = []
        for route in ROUTES:
            for path in (route.path, *(alias for alias, _ in route.aliases)):
                if "{" not in path:
                    self._exact[path] = path
                else:
                    parts = re.split(r"\{[^{}/]+\}", path)
                    self._patterns.append(
                        (re.compile("[^{}/]+".join(map(re.escape, parts))), path))

    def route_of(self, raw_path: str) -> str | None:
        """The cached route a raw request target names, or None (percent-encoded or otherwise
        unusual targets among them: they take the full path)."""
        path = raw_path.partition("?")[0]
        label = self._exact.get(path)
        if label is not None:
            return label
        for pattern, label in self._patterns:
            if pattern.fullmatch(path):
                return label
        return None


class ReadGate:
    """Judges a request from its parsed head (see the module docstring)."""

    __slots__ = ("_access_log", "_admission", "_observer", "_routes", "_settings", "_tenants")

    def __init__(self, app: web.Application) -> None:
        self._settings = app[state.SETTINGS]
        self._admission = app[state.ADMISSION]
        self._tenants = app[state.TENANTS]
        self._observer = app[state.OBSERVER]
        self._access_log = app[state.ACCESS_LOG]
        self._routes = CachedRoutes()

    @property
    def armed(self) -> bool:
        """Whether any tenant's next request may be refused early (else nothing is judged)."""
        return self._admission.backlogged

    def judge(self, message: RawRequestMessage, arrived: float) -> tuple[bytes, float] | None:
        """The complete response refusing ``message`` and how long to hold it, or None for
        the full path. ``arrived``: when its head was read (``time.monotonic``)."""
        if message.method != "POST":
            return None
        route = self._routes.route_of(message.path)
        if route is None:
            return None
        headers = message.headers
        if _EXPECT in headers:  # aiohttp answers 100-continue; the body is not read yet
            return None
        if not is_json_type(headers.get(_CONTENT_TYPE, "").partition(";")[0].strip().lower()):
            return None  # the full path answers 415 first
        authorization = headers.getall(_AUTHORIZATION, ())
        if len(authorization) > 1:
            return None
        try:
            tenant = self._tenants.identify(authorization[0] if authorization else None)
        except GatewayError:
            return None  # the full path answers 401
        settings = self._settings
        try:
            timeout_ms = timeout_ms_of(headers.getall(_DEADLINE, ()),
                                       default_ms=settings.default_timeout_ms,
                                       max_ms=settings.max_timeout_ms)
        except GatewayError:
            return None  # the full path answers 400
        deadline = arrived + timeout_ms / 1000.0
        refusal = self._admission.refuse_early(tenant, deadline)
        if refusal is None:
            return None
        now = time.monotonic()
        hold_s = 0.0
        if refusal.reason in HELD:
            hold_s = hold_for(refusal, settings.admission.refusal_hold_s, deadline - now)
        rid = request_id_for(headers.get(_REQUEST_ID, ""))
        observer = self._observer
        observer.shed(refusal.reason)
        observer.tenant_request(tenant, "shed")
        elapsed = now - arrived + hold_s
        observer.request_done(route, refusal.status, "NONE", elapsed)
        self._access_log.record(rid, "POST", route, refusal.status, "NONE", tenant,
                                elapsed * 1000.0, "")
        return raw_error(refusal, rid, close=False), hold_s
