"""The request path, top to bottom, in one place.

policy (tenant rule, normalize, PII) -> key -> L1/L2 lookup -> singleflight -> upstream (admission,
routing, backend) -> store -> result. Handlers parse and render; the stages live in their own
modules; this is the one place that composes them, so the cache never learns about routing and
routing never learns about the cache.

Per-text caching: a request with N texts looks each one up, sends only the misses (deduplicated,
and minus those another request is already fetching) to a backend in one call, and merges the
answers back in order, so the answer is identical to an uncached one.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.cache.entry import Entry
from gateway.cache.tiered import TieredCache
from gateway.context import RequestContext
from gateway.errors import DeadlineExceeded, GatewayError, Overloaded, PolicyRejected
from gateway.keys import CacheKey, derive_key
from gateway.metrics import GatewayMetrics
from gateway.policy import Decision, Policy, Rule, evaluate_groups
from gateway.policy.store import PolicyStore, record_decision, record_rejection
from gateway.singleflight import FlightAbandoned, SingleFlight
from gateway.upstream import Upstream

log = logging.getLogger("gateway.pipeline")

# Item cache results, also the X-Cache vocabulary.
HIT, MISS, STALE, COALESCED, BYPASS = "HIT", "MISS", "STALE", "COALESCED", "BYPASS"
_META = struct.Struct("<I")  # token count stored beside each embedding


@dataclass(frozen=True, slots=True)
class Fetched:
    """One text's answer from the backend, shared with coalesced followers."""

    vector: np.ndarray
    tokens: int
    compute_ms: float


@dataclass(slots=True)
class ItemResult:
    """One text's embedding and how it was obtained."""

    vector: np.ndarray
    status: str
    age_s: float
    tokens: int
    key: CacheKey | None = None
    entry: Entry | None = None
    """The cache entry this came from (hits): lets the renderer reuse its JSON."""


@dataclass(slots=True)
class EmbedResult:
    """All texts of a request, in request order, and the decision that governed them."""

    items: list[ItemResult]
    decision: Decision
    cache_status: str
    age_s: float

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)


def overall_status(statuses: Sequence[str]) -> str:
    """One X-Cache value for the request: the least cached of its items wins."""
    present = set(statuses)
    for status in (BYPASS, MISS, STALE, COALESCED):
        if status in present:
            return status
    return HIT


def decide(
    policy: Policy, ctx: RequestContext, model: str, groups: Sequence[tuple[str, Sequence[str]]]
) -> Decision:
    """Run the policy over every group of texts (``input``, ``labels``...) as one decision."""
    return evaluate_groups(policy, route=ctx.route, model=model, tenant=ctx.tenant,
                           headers=ctx.headers, groups=groups)


class Pipeline:
    """Composes policy, cache, singleflight and upstream for the embedding-based routes."""

    def __init__(
        self,
        *,
        policies: PolicyStore,
        cache: TieredCache,
        upstream: Upstream,
        model_version: Callable[[str], str | None],
        metrics: GatewayMetrics,
        log_request_text: bool = False,
    ) -> None:
        self.log_request_text = log_request_text
        self.policies = policies
        self.cache = cache
        self.upstream = upstream
        self.model_version = model_version
        self.metrics = metrics
        self.flights: SingleFlight[CacheKey, Fetched] = SingleFlight()
        self._background: set[asyncio.Task[None]] = set()
        self._refreshing: set[CacheKey] = set()

    # -- stages -----------------------------------------------------------------------------

    def policy(
        self, ctx: RequestContext, model: str, groups: Sequence[tuple[str, Sequence[str]]]
    ) -> Decision:
        t0 = time.perf_counter()
        try:
            decision = decide(self.policies.active, ctx, model, groups)
        except PolicyRejected as exc:
            record_rejection(self.metrics, exc)
            raise
        shadow = self.policies.shadow
        if shadow is not None:
            try:
                self.policies.compare_shadow(decision, decide(shadow, ctx, model, groups))
            except GatewayError:
                self.policies.compare_shadow(decision, None)
        record_decision(self.metrics, decision)
        ctx.policy_tag = f"{decision.rule.name}@{decision.policy_version}"
        if self.log_request_text:  # a debug setting; off by default and in every shipped config
            log.debug("request texts", extra={"request_id": ctx.request_id,
                                               "texts": [i.text for i in decision.items]})
        ctx.add_timing("policy", time.perf_counter() - t0)
        return decision

    def keys(self, ctx: RequestContext, model: str, decision: Decision) -> list[CacheKey]:
        version = self.model_version(model) or "unknown"
        norm = decision.rule.normalization.fingerprint
        return [
            derive_key(route=ctx.route, model=model, model_version=version, scope=decision.scope,
                       normalization=norm, canonical=item.text.encode("utf-8"))
            for item in decision.items
        ]

    # -- the embedding path -----------------------------------------------------------------

    async def embed(
        self, ctx: RequestContext, model: str, groups: Sequence[tuple[str, Sequence[str]]]
    ) -> EmbedResult:
        decision = self.policy(ctx, model, groups)
        keys = self.keys(ctx, model, decision)
        rule = decision.rule
        use_cache = decision.cache and ctx.directives.may_write
        read = use_cache and ctx.directives.may_read
        n = len(keys)
        results: list[ItemResult | None] = [None] * n
        entries: list[Entry | None] = [None] * n

        # Unique keys -> the request positions that share them.
        positions: dict[CacheKey, list[int]] = {}
        for i, key in enumerate(keys):
            positions.setdefault(key, []).append(i)

        now = time.time()
        if read or (use_cache and rule.stale_if_error_s > 0):
            t0 = time.perf_counter()
            # Items the policy forbids to store are not read either (an entry written under an
            # older policy must not answer them).
            unique = [k for k, pos in positions.items()
                      if all(decision.items[i].store for i in pos)]
            found = await self.cache.get_many(unique) if unique else []
            ctx.add_timing("cache", time.perf_counter() - t0)
            for key, (entry, _tier) in zip(unique, found, strict=True):
                for i in positions[key]:
                    entries[i] = entry
            if read:
                self._answer_from_cache(ctx, model, keys, entries, results, decision, now)

        missing = [k for k in positions if results[positions[k][0]] is None]
        if missing:
            await self._fetch(ctx, model, decision, keys, positions, missing, entries, results,
                              store=use_cache)

        final = [r for r in results if r is not None]
        if len(final) != n:  # every position is filled by construction; guard the invariant
            raise GatewayError("internal error: unanswered item")
        statuses = [r.status for r in final]
        if not use_cache:
            statuses = [BYPASS]
            for r in final:
                r.status = BYPASS
        for r in final:
            self.metrics.child(self.metrics.cache_items, model, ctx.tenant, r.status.lower()).inc()
        status = overall_status(statuses)
        age = max((r.age_s for r in final), default=0.0)
        ctx.cache_status = status
        return EmbedResult(items=final, decision=decision, cache_status=status, age_s=age)

    def _answer_from_cache(
        self,
        ctx: RequestContext,
        model: str,
        keys: Sequence[CacheKey],
        entries: Sequence[Entry | None],
        results: list[ItemResult | None],
        decision: Decision,
        now: float,
    ) -> None:
        max_age = ctx.directives.max_age
        stale_keys: dict[CacheKey, str] = {}
        saved_ms = 0.0
        for i, entry in enumerate(entries):
            if entry is None:
                continue
            age = entry.age(now)
            if max_age is not None and age > max_age:
                continue
            if entry.is_fresh(now):
                results[i] = _item(entry, HIT, age, keys[i])
                saved_ms += entry.compute_ms
            elif entry.within_swr(now):
                results[i] = _item(entry, STALE, age, keys[i])
                saved_ms += entry.compute_ms
                if decision.items[i].store:
                    stale_keys[keys[i]] = decision.items[i].text
        if saved_ms:
            self.metrics.child(self.metrics.compute_saved, model).inc(saved_ms / 1000.0)
        if stale_keys:
            self._refresh_in_background(ctx, model, decision, stale_keys)

    async def _fetch(
        self,
        ctx: RequestContext,
        model: str,
        decision: Decision,
        keys: Sequence[CacheKey],
        positions: Mapping[CacheKey, list[int]],
        missing: Sequence[CacheKey],
        entries: Sequence[Entry | None],
        results: list[ItemResult | None],
        *,
        store: bool,
    ) -> None:
        led: list[CacheKey] = []
        followed: list[tuple[CacheKey, asyncio.Future[Fetched]]] = []
        for key in missing:
            fut, leader = self.flights.claim(key)
            if leader:
                led.append(key)
            else:
                followed.append((key, fut))
        if followed:
            self.metrics.coalesced.inc(sum(len(positions[k]) for k, _ in followed))

        failure: GatewayError | None = None
        if led:
            texts = [decision.items[positions[k][0]].text for k in led]
            try:
                fetched = await self._call_backend(ctx, model, texts)
            except BaseException as exc:
                for key in led:
                    self.flights.reject(key, exc)
                if not isinstance(exc, GatewayError):
                    raise
                failure = exc
            else:
                for key, item in zip(led, fetched, strict=True):
                    self.flights.resolve(key, item)
                    for i in positions[key]:
                        results[i] = ItemResult(item.vector, MISS, 0.0, item.tokens)
                if store:
                    await self._store(decision.rule, [
                        (key, item) for key, item in zip(led, fetched, strict=True)
                        if all(decision.items[i].store for i in positions[key])
                    ])

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
            for i in positions[key]:
                results[i] = ItemResult(item.vector, COALESCED, 0.0, item.tokens)
        if orphans:
            texts = [decision.items[positions[k][0]].text for k in orphans]
            try:
                fetched = await self._call_backend(ctx, model, texts)
            except GatewayError as exc:
                failure = failure or exc
            else:
                for key, item in zip(orphans, fetched, strict=True):
                    for i in positions[key]:
                        results[i] = ItemResult(item.vector, MISS, 0.0, item.tokens)

        if failure is not None:
            self._stale_if_error(ctx, keys, entries, results, failure)

    def _stale_if_error(
        self,
        ctx: RequestContext,
        keys: Sequence[CacheKey],
        entries: Sequence[Entry | None],
        results: list[ItemResult | None],
        failure: GatewayError,
    ) -> None:
        """Serve stale answers the policy allows when the backends failed; else re-raise."""
        if isinstance(failure, DeadlineExceeded | Overloaded) or failure.status >= 500:
            now = time.time()
            for i, entry in enumerate(entries):
                if results[i] is None and entry is not None and entry.within_sie(now):
                    results[i] = _item(entry, STALE, entry.age(now), keys[i])
        if any(r is None for r in results):
            raise failure
        log.info("served stale-if-error", extra={"request_id": ctx.request_id,
                                                  "error": failure.type})

    async def _call_backend(
        self, ctx: RequestContext, model: str, texts: Sequence[str]
    ) -> list[Fetched]:
        if ctx.time_left() <= 0:
            self.metrics.shed.labels("deadline").inc()
            raise DeadlineExceeded("the request's deadline passed before a backend was called")
        t0 = time.perf_counter()
        res = await self.upstream.infer_texts(model, texts, request_id=ctx.request_id,
                                              deadline=ctx.deadline)
        elapsed = time.perf_counter() - t0
        ctx.add_timing("queue", res.queue_ms / 1000.0)
        ctx.add_timing("compute", res.compute_ms / 1000.0)
        ctx.add_timing("upstream", elapsed)
        per_item = res.compute_ms / max(1, len(texts))
        tokens = res.token_counts or [0] * len(texts)
        return [
            Fetched(np.ascontiguousarray(res.embeddings[i], dtype=np.float32), tokens[i], per_item)
            for i in range(len(texts))
        ]

    async def _store(self, rule: Rule, fetched: Sequence[tuple[CacheKey, Fetched]]) -> None:
        """Write answers the policy lets us keep; after the response, off the request's path."""
        now = time.time()
        items = [
            (key, Entry(
                value=item.vector.tobytes(), created_at=now, ttl_s=rule.ttl_s,
                stale_while_revalidate_s=rule.stale_while_revalidate_s,
                stale_if_error_s=rule.stale_if_error_s, compute_ms=item.compute_ms,
                meta=_META.pack(item.tokens),
            ))
            for key, item in fetched
        ]
        if items:
            # L1 now (the next request hits), L2 as a tracked background write.
            await self.cache.set_many(items, background=True)

    def _refresh_in_background(
        self, ctx: RequestContext, model: str, decision: Decision, stale: Mapping[CacheKey, str]
    ) -> None:
        todo = {k: t for k, t in stale.items() if k not in self._refreshing}
        if not todo:
            return
        self._refreshing.update(todo)
        refresh_ctx = RequestContext(request_id=ctx.request_id, route=ctx.route, tenant=ctx.tenant,
                                     deadline=time.monotonic() + 30.0)

        async def refresh() -> None:
            keys = list(todo)
            try:
                fetched = await self._call_backend(refresh_ctx, model, [todo[k] for k in keys])
                await self._store(decision.rule, list(zip(keys, fetched, strict=True)))
            except GatewayError as exc:
                log.info("stale refresh failed", extra={"request_id": ctx.request_id,
                                                         "error": exc.type})
            finally:
                self._refreshing.difference_update(keys)

        self.spawn(refresh())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run work after the response without losing track of it (drained on shutdown)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background stores and refreshes (shutdown, and tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


def _item(entry: Entry, status: str, age: float, key: CacheKey) -> ItemResult:
    vector = np.frombuffer(entry.value, dtype=np.float32)
    tokens = _META.unpack(entry.meta)[0] if len(entry.meta) == _META.size else 0
    return ItemResult(vector, status, age, tokens, key, entry)
