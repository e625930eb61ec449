"""The stages of every cached route's request between parse and render, top to bottom.

    decide (policy) -> plan (units, keys) -> lookup (tiers) -> charge (quota)
    -> fetch_and_store (coalesce, admission, routing, backend; store) -> finish

The HTTP request path (``gateway/http/serve.py``, one function) calls these stages in order
between parsing and rendering; ``Pipeline.run`` calls the same ones for batch lines and tests.
The stages' work lives in their own modules; this is the one place that composes them, so the
cache never learns about routing and routing never learns about the cache.

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
    Outcome,
    Result,
)
from gateway.pipeline.context import RequestContext
from gateway.pipeline.freshness import overall_status
from gateway.pipeline.plan import Plan
from gateway.pipeline.revalidate import Revalidate
from gateway.pipeline.singleflight import FlightAbandoned, SingleFlight
from gateway.pipeline.units import fetch, items_of
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
        """Answer one parsed request: every item from a cache or a backend, in request order.
        The same stages, in the same order, as the HTTP request path (gateway/http/serve.py),
        for callers without one (batch lines, tests)."""
        decision = self.decide(ctx, call)
        plan = self.plan(ctx, call, decision)
        await self.lookup(ctx, call, plan)
        await self.charge(ctx, plan)
        await self.fetch_and_store(ctx, call, plan)
        return self.finish(ctx, call, plan)

    # -- stages, in request order -------------------------------------------------------------

    def decide(self, ctx: RequestContext, call: Call) -> Decision:
        """The policy's decision on the request's texts (gateway/policy/): normalised or
        redacted texts, whether each may be stored, the rule's TTLs; 422 when a rule rejects."""
        t0 = time.perf_counter()
        groups = call.groups
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

    def plan(self, ctx: RequestContext, call: Call, decision: Decision) -> Plan:
        """The request's items (gateway/pipeline/units.py) and their keys
        (gateway/cache/keys.py); identical items share one key and one answer."""
        items = items_of(call.unit, decision)
        version = self.model_version(call.model) or "unknown"
        norm = decision.rule.normalization.fingerprint
        keys = [derive_key(route=ctx.route, model=call.model, model_version=version,
                           scope=decision.scope, normalization=norm, canonical=item.canonical)
                for item in items]
        positions: dict[CacheKey, list[int]] = {}  # unique keys -> the positions sharing them
        for i, key in enumerate(keys):
            positions.setdefault(key, []).append(i)
        use_cache = decision.cache and ctx.directives.may_write
        storable = [k for k, pos in positions.items() if all(items[i].store for i in pos)]
        return Plan(decision, keys, positions, storable if use_cache else [])

    async def lookup(self, ctx: RequestContext, call: Call, plan: Plan) -> None:
        """Read the cache tiers (gateway/cache/) for the storable keys; fresh entries answer
        (HIT), stale ones answer and refresh in the background (STALE). Skipped when the policy
        or the client keeps the cache out, except to keep entries for stale-if-error."""
        rule = plan.decision.rule
        if not plan.kept or not (ctx.directives.may_read or rule.stale_if_error_s > 0):
            return
        t0 = time.perf_counter()
        found = await self.cache.get_many(plan.kept, ttl_s=rule.ttl_s)
        ctx.add_timing("cache", time.perf_counter() - t0)
        for key, (entry, _tier) in zip(plan.kept, found, strict=True):
            for i in plan.positions[key]:
                plan.entries[i] = entry
        if ctx.directives.may_read:
            self._answer_from_cache(ctx, call, plan.decision, plan.keys, plan.entries,
                                    plan.outcomes)

    async def charge(self, ctx: RequestContext, plan: Plan) -> None:
        """The tenant's quota (gateway/tenants/quota/), now that hits are told from misses:
        texts going to a backend at full cost, cache answers at the hit cost (may raise 429)."""
        if ctx.charge is None:
            return
        missing = plan.missing()
        await ctx.charge(len(missing),
                         len(plan.keys) - sum(len(plan.positions[k]) for k in missing))

    async def fetch_and_store(self, ctx: RequestContext, call: Call, plan: Plan) -> None:
        """The missing items: coalesced with identical ones in flight (singleflight.py), the
        rest asked of a backend through admission and routing (gateway/upstream/), written
        through the one store path (L1 now, the other tiers in the background). When every
        backend failed, entries inside stale-if-error answer (STALE), else the error stands."""
        missing = plan.missing()
        if not missing:
            return
        failure = await self._fetch(ctx, call, plan.decision, plan.positions, missing,
                                    plan.outcomes, set(plan.kept))
        if failure is not None:
            self._stale_if_error(ctx, plan.decision, plan.keys, plan.entries, plan.outcomes,
                                 failure)

    def finish(self, ctx: RequestContext, call: Call, plan: Plan) -> Result:
        """The items in request order with how each was answered (BYPASS for every item the
        cache was kept out of), counted; the request's X-Cache status."""
        final = [o for o in plan.outcomes if o is not None]
        if len(final) != len(plan.keys):  # every position is filled by construction
            raise GatewayError("internal error: unanswered item")
        kept = set(plan.kept)
        for key, o in zip(plan.keys, final, strict=True):
            if key not in kept:
                o.status = BYPASS
        statuses = [o.status for o in final]
        self.observer.items_answered(call.model, ctx.tenant, statuses)
        status = overall_status(statuses)
        ctx.cache_status = status
        return Result(final, plan.decision, status, max((o.age_s for o in final), default=0.0))

    async def _fetch(
        self, ctx: RequestContext, call: Call, decision: Decision,
        positions: dict[CacheKey, list[int]], missing: Sequence[CacheKey],
        outcomes: list[Outcome | None], stored: set[CacheKey],
    ) -> GatewayError | None:
        """Fill the missing items: lead the flights nobody runs, join the others. Returns the
        backend failure that left some unfilled (for stale-if-error), or None."""
        led: list[CacheKey] = []
        leading = []
        followed = []
        rank = self._rank(call, ctx.tenant, ctx.route, ctx.priority)
        for key in missing:
            fut, leader = self.flights.claim(key, rank)
            if leader:
                led.append(key)
                leading.append(fut)
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
                for key, fut in zip(led, leading, strict=True):
                    self.flights.reject(key, fut, exc)
                if not isinstance(exc, GatewayError):
                    raise
                failure = exc
            else:
                for key, fut, item in zip(led, leading, fetched, strict=True):
                    self.flights.resolve(key, fut, item)
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
        res: FetchResult = await fetch(call.unit, self.upstream, ctx, call.model, decision,
                                       indexes)
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
