"""One Redis MGET per event-loop tick for all concurrent L2 lookups.

redis-py's asyncio client costs ~300 us of CPU per call on the reference machine, far more than
the MGET itself: with 64 requests in flight, L2-only hits spent most of their time there
(bench/RESULTS.md, Gateway). Lookups that arrive in the same loop iteration are merged into one
``RedisCache.lookup`` and the answers handed back to each caller in order. A caller that is
cancelled while waiting simply drops its share; the batch goes on for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.redis import RedisCache

_Waiter = tuple[Sequence[CacheKey], "asyncio.Future[tuple[list[Entry | None], bool]]"]


class LookupCoalescer:
    """Merge the L2 lookups of one loop tick into a single ``lookup`` (MGET) call."""

    def __init__(self, l2: RedisCache, *, max_keys: int = 1024) -> None:
        self.l2 = l2
        self.max_keys = max_keys
        self._waiting: list[_Waiter] = []
        self._queued = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def lookup(self, keys: Sequence[CacheKey]) -> tuple[list[Entry | None], bool]:
        """Like ``RedisCache.lookup``; shares the round trip with concurrent callers."""
        if len(keys) >= self.max_keys:
            return await self.l2.lookup(keys)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[list[Entry | None], bool]] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._flush)
        self._waiting.append((keys, fut))
        self._queued += len(keys)
        if self._queued >= self.max_keys:
            self._flush()
        return await fut

    def _flush(self) -> None:
        batch, self._waiting, self._queued = self._waiting, [], 0
        if batch:
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Waiter]) -> None:
        keys = [k for ks, _ in batch for k in ks]
        try:
            found, ok = await self.l2.lookup(keys)
        except BaseException as exc:  # lookup never raises by contract; never strand waiters
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for ks, fut in batch:
            end = start + len(ks)
            if not fut.done():
                fut.set_result((found[start:end], ok))
            start = end
