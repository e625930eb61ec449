"""The stale side of the pipeline: answers from the cache, background revalidation, and
stale-if-error, under ``Pipeline`` (core.py).

``Revalidate`` is the base ``Pipeline`` builds on: ``_answer_from_cache`` answers fresh entries
as HIT and entries inside stale-while-revalidate as STALE, ``_refresh`` starts one background
refresh per stale key (through the same singleflight as misses, so a key already in flight is
left to that flight), and ``_stale_if_error`` serves the stale answers the policy allows when
every backend failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.errors import GatewayError
from gateway.pipeline.background import Background
from gateway.pipeline.call import Call, Fetched, Outcome, PerRequest
from gateway.pipeline.context import RequestContext
from gateway.pipeline.freshness import from_cache, stale_if_error
from gateway.pipeline.singleflight import SingleFlight
from gateway.policy import Decision
from gateway.telemetry.observer import Observer
from gateway.upstream import Upstream
from gateway.upstream.admission.fairqueue import INTERACTIVE, Priority

# The pipeline's logger (core.py uses the same name): one name for the request path.
log = logging.getLogger("gateway.pipeline")

_REFRESH_TIMEOUT_S = 30.0
_REFRESH_PRIORITY: Priority = INTERACTIVE


class Revalidate:
    """Cache answers, refreshes and stale-if-error; ``Pipeline`` sets the parts and defines
    ``_call_backend`` and ``_store``, which a refresh uses as a miss does."""

    observer: Observer
    clock: Callable[[], float]
    flights: SingleFlight[CacheKey, Fetched]
    background: Background
    upstream: Upstream

    if TYPE_CHECKING:
        async def _call_backend(self, ctx: RequestContext, call: Call, decision: Decision,
                                indexes: Sequence[int]) -> list[Fetched]: ...

        async def _store(self, decision: Decision,
                         fetched: Sequence[tuple[CacheKey, Fetched]]) -> None: ...

    def _rank(self, call: Call, tenant: str, route: str, priority: Priority) -> int:
        """The backend priority a call of ``tenant`` on ``route`` at ``priority`` goes at: its
        flights' rank (singleflight)."""
        unit = call.unit
        client = unit.client_priority if isinstance(unit, PerRequest) else 0
        return self.upstream.schedule.priority(tenant, route, priority, client)

    def _answer_from_cache(self, ctx: RequestContext, call: Call, decision: Decision,
                           keys: Sequence[CacheKey], entries: Sequence[Entry | None],
                           outcomes: list[Outcome | None]) -> None:
        stale, saved_ms = from_cache(entries, keys, outcomes, self.clock(),
                                     ctx.directives.max_age, decision.rule)
        if saved_ms:
            self.observer.compute_saved(call.model, saved_ms / 1000.0)
        if stale:
            self._refresh(ctx, call, decision, stale)

    def _stale_if_error(self, ctx: RequestContext, decision: Decision,
                        keys: Sequence[CacheKey], entries: Sequence[Entry | None],
                        outcomes: list[Outcome | None], failure: GatewayError) -> None:
        """Serve stale answers the policy allows when the backends failed; else re-raise."""
        if not stale_if_error(entries, keys, outcomes, self.clock(), failure, decision.rule):
            raise failure
        log.info("served stale-if-error", extra={"request_id": ctx.request_id,
                                                  "error": failure.type})

    def _refresh(self, ctx: RequestContext, call: Call, decision: Decision,
                 stale: dict[CacheKey, int]) -> None:
        """One background refresh per stale key: keys already in flight (a miss or another
        refresh) are left to that flight."""
        rank = self._rank(call, ctx.tenant, ctx.route, _REFRESH_PRIORITY)
        led: list[CacheKey] = []
        leading = []
        for key in stale:
            fut, leader = self.flights.claim(key, rank)
            if leader:
                led.append(key)
                leading.append(fut)
        if not led:
            return
        refresh_ctx = RequestContext(request_id=ctx.request_id, route=ctx.route, tenant=ctx.tenant,
                                     deadline=time.monotonic() + _REFRESH_TIMEOUT_S,
                                     priority=_REFRESH_PRIORITY)

        async def refresh() -> None:
            try:
                fetched = await self._call_backend(refresh_ctx, call, decision,
                                                   [stale[k] for k in led])
            except BaseException as exc:
                for key, fut in zip(led, leading, strict=True):
                    self.flights.reject(key, fut, exc)
                if isinstance(exc, GatewayError):
                    log.info("stale refresh failed", extra={"request_id": ctx.request_id,
                                                             "error": exc.type})
                    return
                raise
            for key, fut, item in zip(led, leading, fetched, strict=True):
                self.flights.resolve(key, fut, item)
            await self._store(decision, list(zip(led, fetched, strict=True)))

        self.background.spawn(refresh())
