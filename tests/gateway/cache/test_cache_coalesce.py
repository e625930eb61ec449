"""Concurrent L2 lookups of one loop tick share one MGET (against a real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from gateway.cache.coalesce import LookupCoalescer
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.memory import MemoryCache
from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from gateway.cache.tiered import TieredCache

pytestmark = pytest.mark.redis


def k(text: str) -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1", scope="t",
                      normalization="n", canonical=text.encode())


class CountingRedis(RedisCache):
    """The real Redis tier, counting round trips."""

    calls: int = 0

    async def lookup(self, keys: Sequence[CacheKey]) -> tuple[list[Entry | None], bool]:
        self.calls += 1
        return await super().lookup(keys)


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[CountingRedis]:
    cache = CountingRedis(RedisSettings(url=redis_url, timeout_s=0.5))
    yield cache
    await cache.close()


async def test_concurrent_lookups_share_one_round_trip(l2: CountingRedis) -> None:
    now = time.time()
    await l2.set_many([(k(f"t{i}"), Entry(f"v{i}".encode(), now, 60.0)) for i in range(30)])
    l2.calls = 0
    cache = TieredCache(MemoryCache(max_entries=1, max_bytes=10**6), l2)
    asks = [[k(f"t{i}"), k(f"absent{i}"), k(f"t{(i + 1) % 30}")] for i in range(30)]
    results = await asyncio.gather(*(cache.get_many(keys) for keys in asks))
    assert l2.calls == 1
    for i, got in enumerate(results):
        values = [e.value if e else None for e, _ in got]
        assert values == [f"v{i}".encode(), None, f"v{(i + 1) % 30}".encode()]


async def test_a_cancelled_waiter_does_not_break_the_batch(l2: CountingRedis) -> None:
    await l2.set_many([(k("x"), Entry(b"X", time.time(), 60.0))])
    co = LookupCoalescer(l2)
    first = asyncio.ensure_future(co.lookup([k("x")]))
    second = asyncio.ensure_future(co.lookup([k("x"), k("y")]))
    await asyncio.sleep(0)
    first.cancel()
    entries, ok = await second
    assert ok and [e.value if e else None for e in entries] == [b"X", None]
    assert first.cancelled()


async def test_big_lookups_go_alone(l2: CountingRedis) -> None:
    co = LookupCoalescer(l2, max_keys=4)
    l2.calls = 0
    results = await asyncio.gather(co.lookup([k(str(i)) for i in range(5)]),
                                   co.lookup([k("a"), k("b")]), co.lookup([k("c"), k("d")]))
    assert [len(r[0]) for r in results] == [5, 2, 2]
    assert l2.calls == 2  # the 5-key one alone; the two small ones together
