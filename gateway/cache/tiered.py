"""L1, then the node tier, then L2: the cache as the request pipeline sees it.

Lookups try L1 first (no I/O); what L1 lacks, or holds only stale, is read from the node tier
(the memory-mapped cache every worker of the host shares, read inline: ``node.py``); only what
is still missing or stale goes to L2, in one MGET (shared with the other lookups of the same
event-loop tick: ``coalesce.py``). Node hits are promoted into L1, L2 hits into the node tier
and L1; a copy from a lower tier replaces a stale one only when it is newer. Stores write L1 at
once and the node tier and L2 either awaited or in the background (L2: tracked tasks; the node
tier: queued to its writer thread with no task or future per store, ``NodeCache.store_nowait``),
which ``flush()`` and ``close()`` wait for. Either lower tier may be absent (no Redis is the
embedded default).

Per-item lookups are counted in ``gateway_cache_lookups_total{tier, result}``: tier ``l1``,
``node`` or ``l2``; result ``hit`` (fresh), ``stale`` (past its TTL but still servable),
``miss``, or ``error`` (the tier failed; for L2: down, slow, or its circuit open).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Sequence
from typing import Any

from gateway.cache.base import CacheUnavailable
from gateway.cache.coalesce import LookupCoalescer
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.memory import MemoryCache
from gateway.cache.node import NodeCache
from gateway.cache.redis import RedisCache
from gateway.cache.tracefile import STORE, TraceRecorder
from gateway.telemetry.observer import NullObserver, Observer

#: Background writes allowed in flight; beyond it ``set_many`` waits for the lower tiers.
MAX_PENDING_WRITES = 256


class TieredCache:
    """The composed cache (see the module docstring)."""

    def __init__(
        self, l1: MemoryCache, l2: RedisCache | None, *, node: NodeCache | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.l1 = l1
        self.node = node
        self.l2 = l2
        self._observer: Observer = observer or NullObserver()
        self._pending: set[asyncio.Task[None]] = set()
        self._l2_lookup = LookupCoalescer(l2).lookup if l2 is not None else None
        self._l1_reported = (l1.evictions, l1.expirations, l1.rejections)
        self._l1_period = 0  # the sketch's period last told (0: not yet)
        #: The trace recorder when ``cache.trace`` is on (set by the app).
        self.recorder: TraceRecorder | None = None

    async def get_many(self, keys: Sequence[CacheKey], *, ttl_s: float = math.inf,
                       ) -> list[tuple[Entry | None, str]]:
        """One ``(entry, tier)`` per key, in order; tier is ``"l1"``, ``"node"``, ``"l2"`` or
        ``""``.

        The entry may be stale (the caller checks ``is_fresh``/``within_swr``/``within_sie``);
        when an upper tier holds only a stale copy, a fresher one from a lower tier wins.
        ``ttl_s``: the TTL of the policy in force now; an entry older than it counts as stale
        here too, whatever TTL it was stored with (so a lower tier's newer copy is asked for).
        """
        now = self.l1.clock()
        out: list[tuple[Entry | None, str]] = []
        ask: list[int] = []
        l1_stale = 0
        l1_get = self.l1.get
        for i, key in enumerate(keys):
            entry = l1_get(key)
            if entry is None:
                out.append((None, ""))
                ask.append(i)
            else:
                out.append((entry, "l1"))
                if not entry.is_fresh(now, ttl_s):
                    l1_stale += 1
                    ask.append(i)
        observe = self._observer.cache_lookups
        observe("l1", "hit", len(keys) - len(ask))
        observe("l1", "stale", l1_stale)
        observe("l1", "miss", len(ask) - l1_stale)
        if self.recorder is not None:
            self.recorder.record(keys, [e for e, _ in out])
        if ask and self.node is not None:
            ask = self._from_node(self.node, keys, ask, out, now, ttl_s)
        if not ask or self._l2_lookup is None:
            return out
        found, ok = await self._l2_lookup([keys[i] for i in ask])
        if not ok:
            observe("l2", "error", len(ask))
            return out
        hit = stale = 0
        promote: list[tuple[CacheKey, Entry]] = []
        for i, entry in zip(ask, found, strict=True):
            if entry is None:
                continue
            if entry.is_fresh(now, ttl_s):
                hit += 1
            else:
                stale += 1
            have = out[i][0]
            if have is None or entry.created_at > have.created_at:
                out[i] = (entry, "l2")
                self.l1.set(keys[i], entry)
                promote.append((keys[i], entry))
            # else: the upper tiers' stale copy is as new as L2's; keep it
        observe("l2", "hit", hit)
        observe("l2", "stale", stale)
        observe("l2", "miss", len(ask) - hit - stale)
        if promote and self.node is not None:
            self.node.store_nowait(promote)
        return out

    def _from_node(self, node: NodeCache, keys: Sequence[CacheKey], ask: list[int],
                   out: list[tuple[Entry | None, str]], now: float, ttl_s: float) -> list[int]:
        """Fill ``out`` from the node tier (inline: a memory-mapped read); returns the indexes
        L2 should still be asked for (missing, or only stale everywhere so far)."""
        observe = self._observer.cache_lookups
        found, ok = node.lookup([keys[i] for i in ask])
        if not ok:
            observe("node", "error", len(ask))
            return ask
        hit = stale = 0
        still: list[int] = []
        for i, entry in zip(ask, found, strict=True):
            have = out[i][0]
            if entry is not None:
                if entry.is_fresh(now, ttl_s):
                    hit += 1
                else:
                    stale += 1
                if have is None or entry.created_at > have.created_at:
                    out[i] = (entry, "node")
                    self.l1.set(keys[i], entry)
                    have = entry
            if have is None or not have.is_fresh(now, ttl_s):
                still.append(i)
        observe("node", "hit", hit)
        observe("node", "stale", stale)
        observe("node", "miss", len(ask) - hit - stale)
        return still

    def _report_l1(self) -> None:
        """L1's evictions by reason since the last report (L1 counts them on the hot path;
        they reach the observer here, after stores, where they happen), and its sketch's
        period when it changed (its miniatures choose it as lookups are counted)."""
        l1 = self.l1
        now = (l1.evictions, l1.expirations, l1.rejections)
        last = self._l1_reported
        if now != last:
            self._l1_reported = now
            for reason, n, m in zip(("capacity", "expired", "rejected"), now, last, strict=True):
                if n > m:
                    self._observer.cache_evictions("l1", n - m, reason)
        period = l1.period
        if period != self._l1_period:
            self._l1_period = period
            self._observer.cache_sketch_period("l1", period)

    async def set_many(
        self, items: Sequence[tuple[CacheKey, Entry]], *, background: bool = False
    ) -> None:
        """Store in L1 now and in the node tier and L2 (awaited, or as tracked tasks with
        ``background``)."""
        self._observer.cache_stored("l1", sum(self.l1.set(key, entry) for key, entry in items))
        self._report_l1()
        if self.recorder is not None:
            self.recorder.record([k for k, _ in items], [e for _, e in items], STORE)
        if not items or (self.node is None and self.l2 is None):
            return
        items = list(items)
        if background and len(self._pending) < MAX_PENDING_WRITES:
            if self.node is not None:
                self.node.store_nowait(items)  # no task: the node tier queues it
            if self.l2 is not None:
                self._background(self._store_l2(self.l2, items))
            return
        if self.node is not None:
            await self._store_node(self.node, items)
        if self.l2 is not None:
            await self._store_l2(self.l2, items)

    def _background(self, write: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(write)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _store_node(self, node: NodeCache, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        await node.store(items)  # the node tier counts its own stores, bytes and evictions

    async def _store_l2(self, l2: RedisCache, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        self._observer.cache_stored("l2", await l2.store(items))

    async def flush(self) -> None:
        """Wait for every background write started so far (the node tier's own included)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self.node is not None:
            await self.node.flush()

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        """Remove from every tier; returns the largest of the counts."""
        await self.flush()
        counts = [await self.l1.delete_many(keys)]
        if self.node is not None:
            counts.append(await self.node.delete_many(keys))
        if self.l2 is not None:
            counts.append(await self.l2.delete_many(keys))
        return max(counts)

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        """Purge L1, the node tier, then L2; returns the largest count (the lower tiers
        normally hold all that the upper ones do).

        L1 is always purged; then ``CacheUnavailable`` (``gateway.cache.base``) is raised if the
        node tier or L2 could not be (L2 is still tried when the node tier failed). Other
        replicas' L1s and node tiers are not reached from here; this host's other workers keep
        their own L1 copies until those expire.
        """
        await self.flush()
        counts = [await self.l1.purge(model=model, scope=scope)]
        failure: CacheUnavailable | None = None
        if self.node is not None:
            try:
                counts.append(await self.node.purge(model=model, scope=scope))
            except CacheUnavailable as exc:
                failure = exc
        if self.l2 is not None:
            counts.append(await self.l2.purge(model=model, scope=scope))
        if failure is not None:
            raise failure
        return max(counts)

    async def close(self) -> None:
        await self.flush()
        await self.l1.close()
        if self.node is not None:
            await self.node.close()
        if self.l2 is not None:
            await self.l2.close()
