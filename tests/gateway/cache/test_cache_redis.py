"""L2 against a real redis-server: batches, expiry, purge, corrupt values, and outages.

Outages are real too: the session's redis-server is killed and restarted (always restarted in a
``finally``, the server is shared), and a hanging Redis is a TCP server that reads and never
answers, the one thing a real Redis cannot be made to do on demand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.cache.base import CacheUnavailable
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from tests.conftest import RedisServer
from tests.gateway.cache.blackhole import black_hole, close_black_hole

pytestmark = pytest.mark.redis


def k(text: str, model: str = "minilm", scope: str = "tenant-a") -> CacheKey:
    return derive_key(route="/v1/embeddings", model=model, model_version="1", scope=scope,
                      normalization="n1", canonical=text.encode())


def fresh(value: bytes = b"vec", ttl: float = 60, **kw: Any) -> Entry:
    return Entry(value, time.time(), ttl, **kw)


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[RedisCache]:
    cache = RedisCache(RedisSettings(url=redis_url, timeout_s=0.5))
    yield cache
    await cache.close()


async def test_set_then_mget_in_order(l2: RedisCache) -> None:
    items = [(k(f"t{i}"), fresh(f"v{i}".encode(), compute_ms=i)) for i in range(20)]
    await l2.set_many(items)
    keys = [k("absent"), *(key for key, _ in items)]
    got, ok = await l2.lookup(keys)
    assert ok
    assert got[0] is None
    assert got[1:] == [e for _, e in items]
    assert await l2.get_many([]) == []


async def test_keys_follow_the_layout_and_expire_with_px(
    l2: RedisCache, raw: aioredis.Redis
) -> None:
    key = k("hello", scope="tenant-secret")
    await l2.set_many([(key, fresh(ttl=10, stale_while_revalidate_s=5, stale_if_error_s=20))])
    names = [n.decode() async for n in raw.scan_iter(match="gw:v1:*")]
    assert names == [key.redis_key("gw:v1")]
    assert "tenant-secret" not in names[0]
    pttl = await raw.pttl(names[0])
    assert 29_000 < pttl <= 30_000  # ttl + max(swr, sie)


async def test_short_ttl_really_expires(l2: RedisCache) -> None:
    await l2.set_many([(k("soon"), fresh(ttl=0.05))])
    assert (await l2.get_many([k("soon")]))[0] is not None
    await asyncio.sleep(0.12)
    assert await l2.get_many([k("soon")]) == [None]


async def test_already_expired_entries_are_not_written(l2: RedisCache, raw: aioredis.Redis) -> None:
    assert await l2.store([(k("old"), Entry(b"v", time.time() - 100, 10))]) == 0
    assert await raw.dbsize() == 0


async def test_corrupt_values_are_misses(l2: RedisCache, raw: aioredis.Redis) -> None:
    registry = CollectorRegistry()
    cache = RedisCache(l2.settings, observer=MetricsObserver(GatewayMetrics(registry)))
    try:
        good, bad, foreign = k("good"), k("bad"), k("foreign")
        await cache.set_many([(good, fresh()), (bad, fresh(b"x" * 100))])
        blob = await raw.get(bad.redis_key("gw:v1"))
        assert isinstance(blob, bytes)
        await raw.set(bad.redis_key("gw:v1"), blob[:-3])
        await raw.set(foreign.redis_key("gw:v1"), b"\x00garbage")
        got, ok = await cache.lookup([good, bad, foreign])
        assert ok and got[0] is not None and got[1:] == [None, None]
        assert registry.get_sample_value("gateway_cache_errors_total", {"tier": "l2"}) == 2
        assert not cache.circuit_open  # bad data is not a Redis failure
    finally:
        await cache.close()


async def test_delete_and_purge_by_model_and_scope(l2: RedisCache, raw: aioredis.Redis) -> None:
    items = [
        (k(f"t{i}", model=model, scope=scope), fresh())
        for i in range(5)
        for model in ("minilm", "minilm:v2", "other*")
        for scope in ("tenant-a", "tenant-b")
    ]
    await l2.set_many(items)
    await raw.set("unrelated:key", b"keep me")
    assert await raw.dbsize() == 31
    assert await l2.delete_many([k("t0"), k("nope")]) == 1
    # "minilm" must not take "minilm:v2" with it, and a glob char in a name is literal.
    assert await l2.purge(model="minilm", scope="tenant-a") == 4
    assert await l2.purge(model="minilm") == 5
    assert await l2.purge(model="other*") == 10
    assert await l2.purge(scope="tenant-b") == 5
    assert await l2.purge() == 5
    assert await raw.dbsize() == 1
    assert await raw.get("unrelated:key") == b"keep me"


@pytest.fixture
def revive(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The shared redis-server, guaranteed running again after the test whatever happens."""
    try:
        yield redis_server
    finally:
        if redis_server.proc is not None and redis_server.proc.poll() is not None:
            redis_server.start()


async def test_redis_killed_means_misses_then_automatic_recovery(
    redis_url: str, revive: RedisServer
) -> None:
    if revive.proc is None:
        pytest.skip("REDIS_URL points at a Redis this session cannot kill")
    registry = CollectorRegistry()
    cache = RedisCache(
        RedisSettings(url=redis_url, timeout_s=0.25, failure_threshold=2, open_s=0.3),
        observer=MetricsObserver(GatewayMetrics(registry)),
    )
    try:
        await cache.set_many([(k("before"), fresh())])  # warms the pool: these connections die
        revive.kill()
        for _ in range(200):
            assert await cache.get_many([k("before"), k("x")]) == [None, None]
            await cache.set_many([(k("during"), fresh())])
        assert cache.circuit_open
        assert registry.get_sample_value("gateway_redis_circuit_open") == 1
        assert (registry.get_sample_value("gateway_cache_errors_total", {"tier": "l2"}) or 0) >= 2
        with pytest.raises(CacheUnavailable):
            await cache.purge()

        revive.start()
        deadline = time.monotonic() + 10
        while cache.circuit_open and time.monotonic() < deadline:
            await cache.get_many([k("probe")])
            await asyncio.sleep(0.05)
        assert not cache.circuit_open
        assert registry.get_sample_value("gateway_redis_circuit_open") == 0
        await cache.set_many([(k("after"), fresh(b"back"))])
        got = await cache.get_many([k("after")])
        assert got[0] is not None and got[0].value == b"back"
    finally:
        await cache.close()


async def test_redis_that_never_answers_times_out_to_misses() -> None:
    server, port, writers = await black_hole()
    cache = RedisCache(RedisSettings(url=f"redis://127.0.0.1:{port}/0", timeout_s=0.05,
                                     connect_timeout_s=0.05, failure_threshold=2, open_s=60))
    try:
        assert await cache.get_many([k("a"), k("b")]) == [None, None]
        await cache.set_many([(k("a"), fresh())])
        assert cache.circuit_open
        # Open: answered at once without touching the socket.
        for _ in range(100):
            assert await cache.get_many([k("a")]) == [None]
        assert not await cache.ping()
    finally:
        await cache.close()
        await close_black_hole(server, writers)


async def test_cancelled_caller_does_not_wedge_the_breaker(redis_url: str) -> None:
    server, port, writers = await black_hole()
    cache = RedisCache(RedisSettings(url=f"redis://127.0.0.1:{port}/0", timeout_s=5,
                                     failure_threshold=1, open_s=0.01))
    try:
        task = asyncio.create_task(cache.get_many([k("a")]))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not cache.circuit_open
    finally:
        await cache.close()
        await close_black_hole(server, writers)


async def test_restart_between_calls_is_transparent(redis_url: str, revive: RedisServer) -> None:
    if revive.proc is None:
        pytest.skip("REDIS_URL points at a Redis this session cannot kill")
    cache = RedisCache(RedisSettings(url=redis_url, timeout_s=0.5, failure_threshold=1))
    try:
        await cache.set_many([(k("a"), fresh())])
        revive.kill()
        revive.start()
        # The pooled connection is dead; the pool notices and reconnects before using it.
        _, ok = await cache.lookup([k("a")])
        assert ok and not cache.circuit_open
    finally:
        await cache.close()


async def test_text_responses_from_a_misconfigured_url_are_misses(
    l2: RedisCache, redis_url: str
) -> None:
    await l2.set_many([(k("a"), fresh(b"ascii only"))])
    cache = RedisCache(RedisSettings(url=f"{redis_url}?decode_responses=True"))
    try:
        assert await cache.get_many([k("a")]) == [None]
    finally:
        await cache.close()
