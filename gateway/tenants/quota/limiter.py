"""Quota enforcement on the request path: ``QuotaGate`` and one ``QuotaState`` per request.

Two checks per request, so a cache hit can be told apart from a backend call:

1. ``admit``, right after the tenant is known and before the body is read: one request against
   ``requests_per_s`` (every request, hits too); the texts and daily limits are only read.
2. ``charge``, after the cache lookup, before any backend call (the pipeline calls it through
   ``RequestContext.charge``): the texts going to a backend, plus ``quotas.hit_cost`` per
   cached text, against ``texts_per_s`` and ``texts_per_day`` (charged both or neither).

Over a limit: ``RateLimited`` (429, ``Retry-After``: when the charge would pass). Each check
goes to Redis (gateway/tenants/quota/shared.py) when one is configured and answers, else to this
process's ``LocalLimiter``: quotas fail open to local limits, never closed for everyone. The
state keeps the latest verdict of each limit for the ``RateLimit-Policy`` and ``RateLimit``
headers (draft-ietf-httpapi-ratelimit-headers) every answer of a limited tenant carries:

    RateLimit-Policy: "requests";q=40;w=2, "texts";q=400;w=2, "daily";q=1000000;w=86400
    RateLimit: "requests";r=39;t=1, "texts";r=400;t=0, "daily";r=999000;t=43210

``q`` is the burst (a day's budget), ``w`` the seconds the burst lasts at the sustained rate
(``q / w`` is the rate), ``r`` what is left now and ``t`` the seconds until the limit is whole
again (a day: until 00:00 UTC). A tenant without limits gets neither header and costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.errors import RateLimited
from gateway.telemetry.observer import NullObserver, Observer
from gateway.tenants.quota.gcra import Limit, Verdict
from gateway.tenants.quota.local import Charge, LocalLimiter
from gateway.tenants.quota.settings import QuotaSettings
from gateway.tenants.quota.shared import SharedLimiter
from gateway.tenants.quota.spec import Quota
from gateway.tenants.store import TenantStore


def limits_of(quota: Quota) -> tuple[Limit | None, tuple[Limit, ...]]:
    """(the requests limit, the texts limits) a quota sets."""
    requests = None if quota.requests_per_s is None else Limit(
        "requests", "rate", quota.requests_per_s,
        Quota.burst_of(quota.requests_per_s, quota.requests_burst))
    texts: list[Limit] = []
    if quota.texts_per_s is not None:
        texts.append(Limit("texts", "rate", quota.texts_per_s,
                           Quota.burst_of(quota.texts_per_s, quota.texts_burst)))
    if quota.texts_per_day is not None:
        texts.append(Limit("daily", "day", float(quota.texts_per_day)))
    return requests, tuple(texts)


class QuotaGate:
    """Checks and charges tenants' quotas (see the module docstring)."""

    def __init__(self, settings: QuotaSettings, tenants: TenantStore, *,
                 shared: SharedLimiter | None = None, local: LocalLimiter | None = None,
                 observer: Observer | None = None) -> None:
        self.settings = settings
        self.tenants = tenants
        self.shared = shared
        self.local = local or LocalLimiter(fraction=settings.local_fraction)
        self.observer: Observer = observer or NullObserver()

    def state(self, tenant: str) -> QuotaState | None:
        """The request's quota state, or None when the tenant has no limits (or quotas are off):
        then nothing is checked, charged or reported."""
        if not self.settings.enabled:
            return None
        quota = self.tenants.spec(tenant).quota
        if not quota.limited:
            return None
        requests, texts = limits_of(quota)
        return QuotaState(self, tenant, requests, texts)

    async def apply(self, tenant: str, charges: Sequence[Charge]) -> list[Verdict]:
        """Every limit's verdict, from Redis when it answers, else from the local limiter."""
        verdicts = None
        if self.shared is not None:
            verdicts = await self.shared.apply(tenant, charges)
        source = "redis" if verdicts is not None else "local"
        if verdicts is None:
            verdicts = self.local.apply(tenant, charges)
        self.observer.quota_checked(source, all(v.allowed for v in verdicts))
        return verdicts

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.close()


class QuotaState:
    """One request's limits and their latest verdicts (the headers are built from them)."""

    __slots__ = ("_gate", "limits", "requests", "tenant", "texts", "verdicts")

    def __init__(self, gate: QuotaGate, tenant: str, requests: Limit | None,
                 texts: tuple[Limit, ...]) -> None:
        self._gate = gate
        self.tenant = tenant
        self.requests = requests
        self.texts = texts
        self.limits = ((requests,) if requests else ()) + texts
        self.verdicts: dict[str, Verdict] = {}

    async def admit(self) -> None:
        """Charge one request (and read the texts limits); ``RateLimited`` when over."""
        await self._check([(limit, 1.0 if limit is self.requests else 0.0)
                           for limit in self.limits])

    async def charge(self, backend_texts: int, cached_texts: int) -> None:
        """Charge the texts of a request after its cache lookup; ``RateLimited`` when over."""
        cost = backend_texts + cached_texts * self._gate.settings.hit_cost
        if cost > 0 and self.texts:
            await self._check([(limit, cost) for limit in self.texts])

    async def _check(self, charges: list[Charge]) -> None:
        verdicts = await self._gate.apply(self.tenant, charges)
        refused: list[tuple[Limit, Verdict]] = []
        for (limit, _), verdict in zip(charges, verdicts, strict=True):
            self.verdicts[limit.name] = verdict
            if not verdict.allowed:
                refused.append((limit, verdict))
        if refused:
            limit, verdict = max(refused, key=lambda lv: lv[1].retry_s)
            for name in {lim.name for lim, _ in refused}:
                self._gate.observer.rate_limited(self.tenant, name)
            raise RateLimited(f"quota exceeded: {_words(limit)}; retry after the "
                              "Retry-After seconds", retry_after_s=verdict.retry_s)

    def headers(self) -> dict[str, str]:
        """``RateLimit-Policy`` and ``RateLimit`` for the limits checked so far."""
        checked = [lim for lim in self.limits if lim.name in self.verdicts]
        if not checked:
            return {}
        policy = ", ".join(f'"{lim.name}";q={lim.quota};w={lim.window_s}' for lim in checked)
        now = ", ".join(
            f'"{lim.name}";r={self.verdicts[lim.name].remaining};'
            f't={max(0, math.ceil(self.verdicts[lim.name].reset_s - 1e-6))}' for lim in checked)
        return {"RateLimit-Policy": policy, "RateLimit": now}


def _words(limit: Limit) -> str:
    if limit.kind == "day":
        return f"{int(limit.amount)} texts per UTC day"
    return f"{limit.amount:g} {limit.name} per second (burst {limit.burst})"
