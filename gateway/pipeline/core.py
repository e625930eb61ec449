"""The request path of every cached route, top to bottom, in one function: ``Pipeline.run``.

    parse (the route's Call) -> tenant (ctx) -> policy -> keys -> lookup (tiers)
    -> coalesce -> admit/route/call (upstream) -> store -> render (the route's Call)

Handlers parse and render; the stages live in their own modules; this is the one place that
composes them, so the cache never learns about routing and routing never learns about the cache.

One set of cache semantics for every route:
- an item the policy forbids to store is neither written nor read (an entry written under an
  older policy must not answer it);
- fresh entries answer as HIT; entries inside stale-while-revalidate answer as STALE and start
  one background refresh per key (deduplicated through the same singleflight as misses);
- when every backend fails (5xx, 503 shed, 504), entries inside stale-if-error answer as STALE,
  also under ``Cache-Control: no-cache``;
- misses of identical items in flight share one backend call; only the missing, deduplicated
  items of a request reach a backend, in one call;
- answers are written through one store path: L1 before the response, L2 in the background.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.tiered import TieredCache
from gateway.errors import DeadlineExceeded, GatewayError, PolicyRejected
from gateway.pipeline.background import Background
from gateway.pipeline.call import (
    BYPASS,
    COALESCED,
    MISS,
    Call,
    Fetched,
    FetchResult,
    Item,
    Outcome,
    Result,
)
from gateway.pipeline.context import RequestContext
from gateway.pipeline.freshness import overall_status
from gateway.pipeline.revalidate import Revalidate
from gateway.pipeline.singleflight import FlightAbandoned, SingleFlight
from gateway.policy import Decision, evaluate_groups
from gateway.policy.store import PolicyStore
from gateway.telemetry.observer import Observer
from gateway.upstream import Upstream

log = logging.getLogger("gateway.pipeline")


class Pipeline(Revalidate):
    """Composes policy, cache, singleflight and upstream for every cached route."""

    def __init__(
        self,
        *,
        policies: PolicyStore,
        cache: TieredCache,
        upstream: Upstream,
        model_version: Callable[[str], str | None],
        observer: Observer,
        clock: Callable[[], float] = time.time,
        log_request_text: bool = False,
    ) -> None:
        self.policies = policies
        self.cache = cache
        self.upstream = upstream
        self.model_version = model_version
        self.observer = observer
        self.clock = clock
        """Wall-clock seconds (entries' ages); tests inject their own to age entries."""
        self.log_request_text = log_request_text
        self.flights: SingleFlight[CacheKey, Fetched] = SingleFlight()
        self.background = Background()

    async def run(self, ctx: RequestContext, call: Call) -> Result:
        """Answer one request: every item from a cache or a backend, in request order."""
        decision = self._policy(ctx, call)
        items = call.items(decision)
        keys = self._keys(ctx, call.model, decision, items)
        use_cache = decision.cache and ctx.directives.may_write
        outcomes: list[Outcome | None] = [None] * len(items)
        entries: list[Entry | None] = [None] * len(items)
        positions: dict[CacheKey, list[int]] = {}  # unique keys -> the positions sharing them
        for i, key in enumerate(keys):
            positions.setdefault(key, []).append(i)
        storable = [k for k, pos in positions.items() if all(items[i].store for i in pos)]

        rule = decision.rule
        if storable and (use_cache and (ctx.directives.may_read or rule.stale_if_error_s > 0)):
            await self._lookup(ctx, storable, positions, entries, rule.ttl_s)
            if ctx.directives.may_read:
                self._answer_from_cache(ctx, call, decision, keys, entries, outcomes)

        missing = [k for k, pos in positions.items() if outcomes[pos[0]] is None]
        if ctx.charge is not None:  # the tenant's quota, now that hits are told from misses
            await ctx.charge(len(missing), len(items) - sum(len(positions[k]) for k in missing))
        if missing:
            stored = set(storable) if use_cache else set()
            failure = await self._fetch(ctx, call, decision, positions, missing, outcomes, stored)
            if failure is not None:
                self._stale_if_error(ctx, decision, keys, entries, outcomes, failure)

        final = [o for o in outcomes if o is not None]
        if len(final) != len(items):  # every position is filled by construction
            raise GatewayError("internal error: unanswered item")
        # BYPASS for every item the cache was kept out of: all of them when the policy or the
        # client says so, else those the policy forbids to store (a no_store detector's).
        kept = set(storable) if use_cache else set()
        for key, o in zip(keys, final, strict=True):
            if key not in kept:
                o.status = BYPASS
        statuses = [o.status for o in final]
        self.observer.items_answered(call.model, ctx.tenant, statuses)
        status = overall_status(statuses)
        ctx.cache_status = status
        return Result(final, decision, status, max((o.age_s for o in final), default=0.0))

    # -- stages -----------------------------------------------------------------------------

    def _policy(self, ctx: RequestContext, call: Call) -> Decision:
        t0 = time.perf_counter()
        groups = call.groups()
        try:
            decision = evaluate_groups(self.policies.active, route=ctx.route, model=call.model,
                                       tenant=ctx.tenant, headers=ctx.headers, groups=groups)
        except PolicyRejected as exc:
            self.observer.policy_rejected(exc)
            raise
        shadow = self.policies.shadow
        if shadow is not None:
            try:
                self.policies.compare_shadow(decision, evaluate_groups(
                    shadow, route=ctx.route, model=call.model, tenant=ctx.tenant,
                    headers=ctx.headers, groups=groups))
            except GatewayError:
                self.policies.compare_shadow(decision, None)
        self.observer.policy_decided(decision)
        ctx.policy_tag = decision.trail
        if self.log_request_text:  # a debug setting; off by default and in every shipped config
            log.debug("request texts", extra={"request_id": ctx.request_id,
                                               "texts": [i.text for i in decision.items]})
        ctx.add_timing("policy", time.perf_counter() - t0)
        return decision

    def _keys(self, ctx: RequestContext, model: str, decision: Decision,
              items: Sequence[Item]) -> list[CacheKey]:
        version = self.model_version(model) or "unknown"
        norm = decision.rule.normalization.fingerprint
        return [derive_key(route=ctx.route, model=model, model_version=version,
                           scope=decision.scope, normalization=norm, canonical=item.canonical)
                for item in items]

    async def _lookup(self, ctx: RequestContext, keys: list[CacheKey],
                      positions: dict[CacheKey, list[int]], entries: list[Entry | None],
                      ttl_s: float) -> None:
        t0 = time.perf_counter()
        found = await self.cache.get_many(keys, ttl_s=ttl_s)
        ctx.add_timing("cache", time.perf_counter() - t0)
        for key, (entry, _tier) in zip(keys, found, strict=True):
            for i in positions[key]:
                entries[i] = entry

    async def _fetch(
        self, ctx: RequestContext, call: Call, decision: Decision,
        positions: dict[CacheKey, list[int]], missing: Sequence[CacheKey],
        outcomes: list[Outcome | None], stored: set[CacheKey],
    ) -> GatewayError | None:
        """Fill the missing items: lead the flights nobody runs, join the others. Returns the
        backend failure that left some unfilled (for stale-if-error), or None."""
        led: list[CacheKey] = []
        followed = []
        for key in missing:
            fut, leader = self.flights.claim(key)
            if leader:
                led.append(key)
            else:
                followed.append((key, fut))
        if followed:
            self.observer.coalesced(sum(len(positions[k]) for k, _ in followed))

        failure: GatewayError | None = None
        if led:
            try:
                fetched = await self._call_backend(ctx, call, decision,
                                                   [positions[k][0] for k in led])
            except BaseException as exc:
                for key in led:
                    self.flights.reject(key, exc)
                if not isinstance(exc, GatewayError):
                    raise
                failure = exc
            else:
                for key, item in zip(led, fetched, strict=True):
                    self.flights.resolve(key, item)
                self._fill(led, fetched, positions, outcomes, MISS)
                await self._store(decision, [(k, f) for k, f in zip(led, fetched, strict=True)
                                       if k in stored])

        orphans: list[CacheKey] = []
        for key, fut in followed:
            try:
                item = await self.flights.join(fut)
            except FlightAbandoned:
                orphans.append(key)  # the leader's client went away: fetch it ourselves
                continue
            except GatewayError as exc:
                failure = failure or exc
                continue
            self._fill([key], [item], positions, outcomes, COALESCED)
        if orphans:
            try:
                fetched = await self._call_backend(ctx, call, decision,
                                                   [positions[k][0] for k in orphans])
            except GatewayError as exc:
                failure = failure or exc
            else:
                self._fill(orphans, fetched, positions, outcomes, MISS)
                await self._store(decision, [(k, f) for k, f in zip(orphans, fetched, strict=True)
                                       if k in stored])
        return failure

    @staticmethod
    def _fill(keys: Sequence[CacheKey], fetched: Sequence[Fetched],
              positions: dict[CacheKey, list[int]], outcomes: list[Outcome | None],
              status: str) -> None:
        for key, item in zip(keys, fetched, strict=True):
            for i in positions[key]:
                outcomes[i] = Outcome(item.value, item.meta, status, 0.0)

    async def _call_backend(self, ctx: RequestContext, call: Call, decision: Decision,
                            indexes: Sequence[int]) -> list[Fetched]:
        if ctx.time_left() <= 0:
            self.observer.shed("deadline")
            raise DeadlineExceeded("the request's deadline passed before a backend was called")
        t0 = time.perf_counter()
        res: FetchResult = await call.fetch(self.upstream, ctx, decision, indexes)
        ctx.add_timing("queue", res.queue_ms / 1000.0)
        ctx.add_timing("compute", res.compute_ms / 1000.0)
        ctx.add_timing("upstream", time.perf_counter() - t0)
        if len(res.items) != len(indexes):
            raise GatewayError("internal error: a route answered the wrong number of items")
        return res.items

    async def _store(self, decision: Decision, fetched: Sequence[tuple[CacheKey, Fetched]]) -> None:
        """The one store path: L1 now (the next request hits), L2 as a tracked background write.
        Only items the policy lets us keep reach it (the caller filters)."""
        if not fetched:
            return
        rule = decision.rule
        now = self.clock()
        entries = [(key, Entry(value=item.value, created_at=now, ttl_s=rule.ttl_s,
                               stale_while_revalidate_s=rule.stale_while_revalidate_s,
                               stale_if_error_s=rule.stale_if_error_s,
                               compute_ms=item.compute_ms, meta=item.meta))
                   for key, item in fetched]
        await self.cache.set_many(entries, background=True)

    async def drain(self) -> None:
        """Wait for background refreshes and stores (shutdown, and tests)."""
        await self.background.drain()
        await self.cache.flush()
