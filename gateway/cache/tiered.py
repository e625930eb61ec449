"""L1 in front of an optional L2: the cache as the request pipeline sees it.

Lookups try L1 first (no I/O); only what L1 lacks, or holds only stale, goes to L2, in one MGET
(shared with the other lookups of the same event-loop tick: ``coalesce.py``).
L2 hits are promoted into L1. Stores write L1 at once and L2 either awaited (bounded by its short
timeout) or in a tracked background task that ``flush()`` and ``close()`` wait for. With no L2
(the embedded default) this is just the LRU.

Per-item lookups are counted in ``gateway_cache_lookups_total{tier, result}``: result is ``hit``
(fresh), ``stale`` (past its TTL but still servable), ``miss``, or ``error`` (L2 down, slow, or
its circuit open).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.cache.coalesce import LookupCoalescer
from gateway.cache.entry import Entry
from gateway.cache.memory import MemoryCache
from gateway.cache.redis import RedisCache
from gateway.keys import CacheKey
from gateway.observe import NullObserver, Observer

#: Background L2 writes allowed in flight; beyond it ``set_many`` waits for L2 instead.
MAX_PENDING_WRITES = 256


class TieredCache:
    """The composed cache (see the module docstring)."""

    def __init__(
        self, l1: MemoryCache, l2: RedisCache | None, *, observer: Observer | None = None
    ) -> None:
        self.l1 = l1
        self.l2 = l2
        self._observer: Observer = observer or NullObserver()
        self._pending: set[asyncio.Task[None]] = set()
        self._l2_lookup = LookupCoalescer(l2).lookup if l2 is not None else None

    async def get_many(self, keys: Sequence[CacheKey]) -> list[tuple[Entry | None, str]]:
        """One ``(entry, tier)`` per key, in order; tier is ``"l1"``, ``"l2"`` or ``""``.

        The entry may be stale (the caller checks ``is_fresh``/``within_swr``/``within_sie``);
        when L1 holds only a stale copy, a fresher one from L2 wins.
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
                if not entry.is_fresh(now):
                    l1_stale += 1
                    ask.append(i)
        observe = self._observer.cache_lookups
        observe("l1", "hit", len(keys) - len(ask))
        observe("l1", "stale", l1_stale)
        observe("l1", "miss", len(ask) - l1_stale)
        if not ask or self._l2_lookup is None:
            return out
        found, ok = await self._l2_lookup([keys[i] for i in ask])
        if not ok:
            observe("l2", "error", len(ask))
            return out
        hit = stale = 0
        for i, entry in zip(ask, found, strict=True):
            if entry is None:
                continue
            if entry.is_fresh(now):
                hit += 1
            else:
                stale += 1
            have = out[i][0]
            if have is None or entry.created_at > have.created_at:
                out[i] = (entry, "l2")
                self.l1.set(keys[i], entry)
            # else: L1's stale copy is as new as L2's; keep it
        observe("l2", "hit", hit)
        observe("l2", "stale", stale)
        observe("l2", "miss", len(ask) - hit - stale)
        return out

    async def set_many(
        self, items: Sequence[tuple[CacheKey, Entry]], *, background: bool = False
    ) -> None:
        """Store in L1 now and in L2 (awaited, or as a tracked task with ``background``)."""
        self._observer.cache_stored("l1", sum(self.l1.set(key, entry) for key, entry in items))
        if self.l2 is None or not items:
            return
        if background and len(self._pending) < MAX_PENDING_WRITES:
            task = asyncio.create_task(self._store_l2(self.l2, list(items)))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        await self._store_l2(self.l2, items)

    async def _store_l2(self, l2: RedisCache, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        self._observer.cache_stored("l2", await l2.store(items))

    async def flush(self) -> None:
        """Wait for every background L2 write started so far."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        """Remove from both tiers; returns the larger of the two counts."""
        n1 = await self.l1.delete_many(keys)
        n2 = await self.l2.delete_many(keys) if self.l2 is not None else 0
        return max(n1, n2)

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        """Purge L1 then L2; returns the larger count (L2 normally holds all that L1 does).

        L1 is always purged; then ``CacheUnavailable`` (``gateway.cache.base``) is raised if L2
        could not be. Other replicas' L1s are not reached from here.
        """
        await self.flush()
        n1 = await self.l1.purge(model=model, scope=scope)
        if self.l2 is None:
            return n1
        return max(n1, await self.l2.purge(model=model, scope=scope))

    async def close(self) -> None:
        await self.flush()
        await self.l1.close()
        if self.l2 is not None:
            await self.l2.close()
