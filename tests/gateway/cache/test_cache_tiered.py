"""L1 in front of a real Redis: one MGET for L1 misses, promotion, metrics, L2 outages."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.memory import MemoryCache
from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from gateway.cache.tiered import TieredCache
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.gateway.cache.blackhole import black_hole, close_black_hole


def k(text: str, scope: str = "tenant-a") -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1", scope=scope,
                      normalization="n1", canonical=text.encode())


def fresh(value: bytes = b"vec", ttl: float = 60, age: float = 0.0, **kw: Any) -> Entry:
    return Entry(value, time.time() - age, ttl, **kw)


def lookups(registry: CollectorRegistry, tier: str, result: str) -> float:
    value = registry.get_sample_value(
        "gateway_cache_lookups_total", {"tier": tier, "result": result}
    )
    return value or 0.0


def l1() -> MemoryCache:
    return MemoryCache(max_entries=1000, max_bytes=10**7)


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[RedisCache]:
    cache = RedisCache(RedisSettings(url=redis_url, timeout_s=0.5))
    yield cache
    await cache.close()


@pytest.mark.redis
async def test_l2_hits_are_promoted_and_counted(l2: RedisCache) -> None:
    registry = CollectorRegistry()
    writer = TieredCache(l1(), l2)
    await writer.set_many([(k("a"), fresh(b"A")), (k("b"), fresh(b"B"))])

    # Another replica: empty L1, same Redis.
    reader = TieredCache(l1(), l2, observer=MetricsObserver(GatewayMetrics(registry)))
    got = await reader.get_many([k("a"), k("zz"), k("b")])
    assert [(e.value if e else None, t) for e, t in got] == [
        (b"A", "l2"), (None, ""), (b"B", "l2"),
    ]
    assert len(reader.l1) == 2
    got = await reader.get_many([k("a"), k("b")])
    assert [t for _, t in got] == ["l1", "l1"]
    assert lookups(registry, "l1", "hit") == 2
    assert lookups(registry, "l1", "miss") == 3
    assert lookups(registry, "l2", "hit") == 2
    assert lookups(registry, "l2", "miss") == 1


@pytest.mark.redis
async def test_only_l1_misses_go_to_l2(l2: RedisCache) -> None:
    cache = TieredCache(l1(), l2)
    cache.l1.set(k("only-l1"), fresh(b"L1"))
    await l2.set_many([(k("only-l1"), fresh(b"L2"))])
    ((entry, tier),) = await cache.get_many([k("only-l1")])
    assert entry is not None and (entry.value, tier) == (b"L1", "l1")


@pytest.mark.redis
async def test_stale_l1_copy_loses_to_a_fresher_l2_one(l2: RedisCache) -> None:
    cache = TieredCache(l1(), l2)
    cache.l1.set(k("x"), fresh(b"old", ttl=10, age=20, stale_while_revalidate_s=60))
    cache.l1.set(k("y"), fresh(b"old-y", ttl=10, age=20, stale_while_revalidate_s=60))
    await l2.set_many([(k("x"), fresh(b"new"))])
    got = await cache.get_many([k("x"), k("y")])
    assert [(e.value if e else None, t) for e, t in got] == [(b"new", "l2"), (b"old-y", "l1")]


@pytest.mark.redis
async def test_background_writes_are_tracked_and_flushed(l2: RedisCache) -> None:
    cache = TieredCache(l1(), l2)
    await cache.set_many([(k(f"t{i}"), fresh()) for i in range(10)], background=True)
    await cache.flush()
    got = await l2.get_many([k(f"t{i}") for i in range(10)])
    assert all(e is not None for e in got)


@pytest.mark.redis
async def test_purge_and_delete_reach_both_tiers(l2: RedisCache) -> None:
    cache = TieredCache(l1(), l2)
    await cache.set_many([(k("a"), fresh()), (k("b", scope="t2"), fresh())])
    assert await cache.delete_many([k("a")]) == 1
    assert await cache.purge(scope="t2") == 1
    assert len(cache.l1) == 0
    assert await l2.get_many([k("a"), k("b", scope="t2")]) == [None, None]


async def test_without_l2_it_is_just_the_lru() -> None:
    registry = CollectorRegistry()
    cache = TieredCache(l1(), None, observer=MetricsObserver(GatewayMetrics(registry)))
    await cache.set_many([(k("a"), fresh())], background=True)
    await cache.flush()
    got = await cache.get_many([k("a"), k("b")])
    assert [t for _, t in got] == ["l1", ""]
    assert await cache.purge() == 1
    assert lookups(registry, "l2", "miss") == lookups(registry, "l2", "error") == 0
    await cache.close()


async def test_l2_down_serves_l1_and_counts_errors() -> None:
    server, port, writers = await black_hole()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    l2 = RedisCache(RedisSettings(url=f"redis://127.0.0.1:{port}/0", timeout_s=0.05,
                                  connect_timeout_s=0.05, failure_threshold=1, open_s=60),
                    observer=MetricsObserver(metrics))
    cache = TieredCache(l1(), l2, observer=MetricsObserver(metrics))
    try:
        await cache.set_many([(k("a"), fresh())])  # L1 stored; the L2 write times out
        got = await cache.get_many([k("a"), k("b"), k("c")])
        assert [t for _, t in got] == ["l1", "", ""]
        assert lookups(registry, "l2", "error") == 2
        assert registry.get_sample_value("gateway_redis_circuit_open") == 1
        assert registry.get_sample_value("gateway_cache_stores_total", {"tier": "l1"}) == 1
        assert (registry.get_sample_value("gateway_cache_stores_total", {"tier": "l2"}) or 0) == 0
    finally:
        await cache.close()
        await close_black_hole(server, writers)
