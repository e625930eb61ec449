"""L1: LRU by count and by bytes, TTL with an injected clock, purge and stats."""

from __future__ import annotations

from typing import Any

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.memory import ENTRY_OVERHEAD, MemoryCache
from gateway.cache.settings import CacheSettings


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def k(i: int, model: str = "m", scope: str = "t") -> CacheKey:
    return CacheKey(model, scope, i.to_bytes(16, "big"))


def entry(clock: Clock, value: bytes = b"v", ttl: float = 60, **kw: Any) -> Entry:
    return Entry(value, clock.now, ttl, **kw)


def test_lru_eviction_by_count_keeps_recently_used() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=3, max_bytes=10**9, clock=clock)
    for i in range(3):
        c.set(k(i), entry(clock))
    assert c.get(k(0)) is not None  # 0 becomes most recent; 1 is now the LRU
    c.set(k(3), entry(clock))
    assert c.get(k(1)) is None
    assert [c.get(k(i)) is not None for i in (0, 2, 3)] == [True, True, True]
    assert c.stats().evictions == 1
    assert len(c) == 3


def test_lru_eviction_by_bytes() -> None:
    clock = Clock()
    size = 100 + ENTRY_OVERHEAD
    c = MemoryCache(max_entries=1000, max_bytes=size * 3, clock=clock)
    for i in range(5):
        c.set(k(i), entry(clock, b"x" * 100))
    assert len(c) == 3
    assert c.bytes == size * 3
    assert c.get(k(0)) is None and c.get(k(1)) is None and c.get(k(4)) is not None
    c.set(k(9), entry(clock, b"x" * (size * 2 - ENTRY_OVERHEAD)))  # needs two slots
    assert len(c) == 2
    assert c.bytes <= c.max_bytes


def test_too_big_or_expired_entries_are_not_stored() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=10, max_bytes=1000, clock=clock)
    c.set(k(1), entry(clock, b"small"))
    assert not c.set(k(1), entry(clock, b"x" * 1000))
    assert c.get(k(1)) is None  # the replaced value does not linger either
    assert c.bytes == 0
    assert not c.set(k(2), Entry(b"v", clock.now - 100, 10))
    assert len(c) == 0


def test_replacing_a_key_keeps_byte_count_exact() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=10, max_bytes=10**6, clock=clock)
    c.set(k(1), entry(clock, b"x" * 10))
    c.set(k(1), entry(clock, b"x" * 50))
    assert len(c) == 1
    assert c.bytes == 50 + ENTRY_OVERHEAD
    c.delete(k(1))
    assert c.bytes == 0


def test_ttl_expiry_keeps_stale_windows() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=10, max_bytes=10**6, clock=clock)
    c.set(k(1), entry(clock, ttl=10, stale_while_revalidate_s=5))
    c.set(k(2), entry(clock, ttl=10))
    clock.now += 12
    e1 = c.get(k(1))
    assert e1 is not None and not e1.is_fresh(clock.now) and e1.within_swr(clock.now)
    assert c.get(k(2)) is None
    clock.now += 3
    assert c.get(k(1)) is None
    s = c.stats()
    assert (s.entries, s.bytes, s.expirations, s.hits, s.misses) == (0, 0, 2, 1, 2)


def test_pressure_evicts_expired_first_from_the_lru_end() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=2, max_bytes=10**6, clock=clock)
    c.set(k(1), entry(clock, ttl=1))
    c.set(k(2), entry(clock, ttl=100))
    clock.now += 5
    c.set(k(3), entry(clock))
    assert c.stats().expirations == 1 and c.stats().evictions == 0
    assert c.get(k(2)) is not None


def test_sweep_drops_expired() -> None:
    clock = Clock()
    c = MemoryCache(max_entries=100, max_bytes=10**6, clock=clock)
    for i in range(10):
        c.set(k(i), entry(clock, ttl=1 if i % 2 else 100))
    clock.now += 2
    assert c.sweep() == 5
    assert len(c) == 5


async def test_async_tier_and_purge() -> None:
    clock = Clock()
    c = MemoryCache.from_settings(CacheSettings(max_entries=100, max_bytes=10**6), clock)
    items = [(k(i, model=f"m{i % 2}", scope=f"t{i % 3}"), entry(clock)) for i in range(12)]
    await c.set_many(items)
    got = await c.get_many([k(0, "m0", "t0"), k(99)])
    assert got[0] is not None and got[1] is None
    assert await c.purge(model="m0", scope="t0") == 2
    assert await c.purge(model="m1") == 6
    assert await c.purge(scope="t1") == 2
    assert await c.delete_many([items[2][0], k(99)]) == 1
    assert await c.purge() == 1
    assert len(c) == 0 and c.bytes == 0

