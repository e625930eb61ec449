"""L1 -> node -> L2 composed in ``TieredCache``: promotion, stale handling, stores, purges.

The node tier is real (LMDB in a tmp dir); L2 is a real Redis where a test needs one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.cache.entry import Entry
from gateway.cache.memory import MemoryCache
from gateway.cache.node import NodeCache
from gateway.cache.redis import RedisCache
from gateway.cache.settings import NodeCacheSettings, RedisSettings
from gateway.cache.tiered import TieredCache
from tests.gateway.cache.test_cache_node import Recorder, k

Tiers = Callable[..., tuple[TieredCache, Recorder]]


def fresh(value: bytes, ttl: float = 60, age: float = 0.0, **kw: Any) -> Entry:
    return Entry(value, time.time() - age, ttl, **kw)


@pytest.fixture
async def tiers(tmp_path: Path) -> AsyncIterator[Tiers]:
    """``tiers(l2=None)`` -> a TieredCache with a fresh L1 over the one node directory of the
    test (as another worker of the same host would have) and its recorder."""
    made: list[TieredCache] = []
    settings = NodeCacheSettings(path=str(tmp_path / "node"))

    def make(l2: RedisCache | None = None) -> tuple[TieredCache, Recorder]:
        rec = Recorder()
        cache = TieredCache(MemoryCache(max_entries=100, max_bytes=10**7), l2,
                            node=NodeCache(settings, observer=rec), observer=rec)
        made.append(cache)
        return cache, rec

    yield make
    for cache in made:
        await cache.flush()
        await cache.l1.close()
        assert cache.node is not None
        await cache.node.close()


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[RedisCache]:
    cache = RedisCache(RedisSettings(url=redis_url, timeout_s=0.5))
    yield cache
    await cache.close()


async def test_a_store_in_one_worker_is_a_node_hit_in_another_then_an_l1_hit(
        tiers: Tiers) -> None:
    writer, _ = tiers()
    await writer.set_many([(k("a"), fresh(b"A"))], background=True)
    await writer.flush()
    reader, rec = tiers()
    got = await reader.get_many([k("a"), k("nope")])
    assert [(e.value if e else None, tier) for e, tier in got] == [(b"A", "node"), (None, "")]
    assert (rec.counts[("node", "hit")], rec.counts[("node", "miss")]) == (1, 1)
    again = await reader.get_many([k("a")])
    assert again[0][1] == "l1", "a node hit is promoted into L1"
    assert rec.counts[("node", "hit")] == 1


async def test_a_fresher_node_copy_replaces_a_stale_l1_one(tiers: Tiers) -> None:
    cache, rec = tiers()
    old = fresh(b"old", ttl=10, age=20, stale_while_revalidate_s=60)
    cache.l1.set(k("x"), old)
    cache.l1.set(k("y"), old)
    assert cache.node is not None
    await cache.node.set_many([(k("x"), fresh(b"new")), (k("y"), old)])
    got = await cache.get_many([k("x"), k("y")])
    assert [(e.value if e else None, tier) for e, tier in got] == [(b"new", "node"),
                                                                    (b"old", "l1")]
    assert cache.l1.get(k("x")) == got[0][0]
    assert (rec.counts[("l1", "stale")], rec.counts[("node", "hit")],
            rec.counts[("node", "stale")]) == (2, 1, 1)


async def test_delete_and_purge_reach_the_node_tier(tiers: Tiers) -> None:
    cache, _ = tiers()
    items = [(k(f"t{i}", scope=s), fresh(b"v")) for i in range(3) for s in ("acme", "globex")]
    await cache.set_many(items)
    other, _ = tiers()
    assert await cache.delete_many([k("t0", scope="acme")]) == 1
    assert await cache.purge(scope="globex") == 3
    got = await other.get_many([key for key, _ in items])
    assert [tier for _, tier in got] == ["", "", "node", "", "node", ""]
    assert await cache.purge(model="minilm") == 2
    fresh_worker, _ = tiers()
    assert [e for e, _ in await fresh_worker.get_many([key for key, _ in items])] == [None] * 6


async def test_a_closed_node_tier_counts_errors_and_lookups_go_on(tiers: Tiers) -> None:
    cache, rec = tiers()
    assert cache.node is not None
    await cache.node.close()
    assert await cache.get_many([k("a")]) == [(None, "")]
    assert rec.counts[("node", "error")] == 1
    await cache.set_many([(k("a"), fresh(b"A"))])  # L1 still works; the node write is dropped
    assert (await cache.get_many([k("a")]))[0][1] == "l1"


@pytest.mark.redis
async def test_l2_hits_fill_the_node_tier_and_node_hits_skip_l2(
        tiers: Tiers, l2: RedisCache) -> None:
    elsewhere, _ = tiers()  # another host: L2 only
    await l2.set_many([(k("shared"), fresh(b"S"))])
    first, rec = tiers(l2)
    got = await first.get_many([k("shared")])
    assert got[0][1] == "l2"
    assert (rec.counts[("node", "miss")], rec.counts[("l2", "hit")]) == (1, 1)
    await first.flush()  # the promotion into the node tier is a background write
    second, rec2 = tiers(l2)
    got = await second.get_many([k("shared")])
    assert got[0][1] == "node"
    assert rec2.counts[("l2", "hit")] + rec2.counts[("l2", "miss")] == 0, "L2 not asked"
    await elsewhere.flush()


@pytest.mark.redis
async def test_stores_reach_node_and_l2_and_purge_reaches_both(
        tiers: Tiers, l2: RedisCache) -> None:
    cache, _ = tiers(l2)
    await cache.set_many([(k("p"), fresh(b"P"))], background=True)
    await cache.flush()
    assert (await l2.get_many([k("p")]))[0] is not None
    assert cache.node is not None and (await cache.node.get_many([k("p")]))[0] is not None
    assert await cache.purge(model="minilm") >= 1
    assert await l2.get_many([k("p")]) == [None]
    assert await cache.node.get_many([k("p")]) == [None]
