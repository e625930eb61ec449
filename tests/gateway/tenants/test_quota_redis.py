"""The shared limiter against a real redis-server: the Lua script agrees with the Python
arithmetic, charges all limits or none, keeps tenant ids out of its keys, and when Redis dies
the gate falls back to local limits without an error."""

from __future__ import annotations

import asyncio
import fnmatch
import time

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from gateway.errors import RateLimited
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.tenants.directory import Tenants
from gateway.tenants.quota.gcra import Limit
from gateway.tenants.quota.limiter import QuotaGate
from gateway.tenants.quota.settings import QuotaSettings
from gateway.tenants.quota.shared import SharedLimiter, quota_key
from gateway.tenants.quota.spec import Quota, TenantSpec
from gateway.tenants.store import TenantStore
from tests.conftest import RedisServer

TENANT = "acme-secret-tenant-name"
BURST = Limit("requests", "rate", 0.01, 5)  # one more every 100 s: nothing refills in a test


def settings(url: str, **extra: object) -> RedisSettings:
    return RedisSettings(url=url, **extra)  # type: ignore[arg-type]


async def test_the_script_counts_like_gcra_and_keeps_tenant_ids_out_of_keys(
        redis_url: str) -> None:
    limiter = SharedLimiter(settings(redis_url))
    try:
        seen = []
        for _ in range(7):
            verdicts = await limiter.apply(TENANT, [(BURST, 1)])
            assert verdicts is not None
            seen.append((verdicts[0].allowed, verdicts[0].remaining))
        assert seen == [(True, 4), (True, 3), (True, 2), (True, 1), (True, 0), (False, 0),
                        (False, 0)]
        refused = (await limiter.apply(TENANT, [(BURST, 1)]) or [])[0]
        assert 99.0 <= refused.retry_s <= 100.0  # one interval at 0.01/s
        peek = (await limiter.apply(TENANT, [(BURST, 0)]) or [])[0]
        assert peek.allowed and peek.remaining == 0

        texts = Limit("texts", "rate", 0.01, 10)
        day = Limit("daily", "day", 12.0)
        both = await limiter.apply(TENANT, [(texts, 8), (day, 8)])
        assert both is not None and [v.remaining for v in both] == [2, 4]
        refused_day = await limiter.apply(TENANT, [(texts, 2), (day, 5)])
        assert refused_day is not None and [v.allowed for v in refused_day] == [True, False]
        after = await limiter.apply(TENANT, [(texts, 0), (day, 0)])  # nothing was charged
        assert after is not None and [v.remaining for v in after] == [2, 4]

        client = aioredis.from_url(redis_url, decode_responses=True)
        try:
            keys = sorted(str(k) for k in await client.keys("*"))
            assert keys == sorted(quota_key("gw:v1", TENANT, n)
                                  for n in ("requests", "texts", "daily"))
            assert all(TENANT not in k for k in keys)
            assert 0 < await client.pttl(quota_key("gw:v1", TENANT, "requests")) <= 502_000
            day_fields = await client.hgetall(quota_key("gw:v1", TENANT, "daily"))
            assert day_fields["n"] == "8"
            assert int(day_fields["d"]) == int(time.time() // 86400)
            # No cache purge pattern (all, by model, by tenant) reaches a quota key.
            cache = RedisCache(settings(redis_url))
            patterns = [cache.purge_pattern(model=None, scope=None),
                        cache.purge_pattern(model="minilm", scope=TENANT),
                        cache.purge_pattern(model=None, scope=TENANT)]
            await cache.close()
            assert not [k for k in keys for p in patterns if fnmatch.fnmatchcase(k, p)]
        finally:
            await client.aclose()
    finally:
        await limiter.close()


async def test_when_redis_dies_local_limits_apply_and_nothing_errors(
        redis_url: str, redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(GatewayMetrics(registry))
    tenants = Tenants(keys=(), configured=True,
                      specs={TENANT: TenantSpec(quota=Quota(requests_per_s=0.01,
                                                            requests_burst=3))})
    shared = SharedLimiter(settings(redis_url, timeout_s=0.2, failure_threshold=2, open_s=0.3))
    gate = QuotaGate(QuotaSettings(), TenantStore(None, tenants=tenants), shared=shared,
                     observer=observer)

    def checks(source: str, result: str) -> float:
        return registry.get_sample_value("gateway_quota_checks_total",
                                         {"source": source, "result": result}) or 0.0

    try:
        state = gate.state(TENANT)
        assert state is not None
        await state.admit()  # shared: 2 left in Redis
        assert checks("redis", "allowed") == 1
        redis_server.kill()
        allowed = refused = 0
        for _ in range(5):  # Redis gone: each answer comes from this process's own limit
            state = gate.state(TENANT)
            assert state is not None
            try:
                await state.admit()
                allowed += 1
            except RateLimited:
                refused += 1
            assert "RateLimit" in state.headers()
        assert (allowed, refused) == (3, 2)  # the local limit: a fresh burst of 3
        assert checks("local", "allowed") == 3 and checks("local", "limited") == 2
        assert shared.breaker.is_open
    finally:
        if redis_server.proc is not None and redis_server.proc.poll() is not None:
            redis_server.start()
    deadline = time.monotonic() + 10
    answered = None
    while answered is None and time.monotonic() < deadline:  # the breaker probes after open_s
        answered = await shared.apply(TENANT, [(Limit("requests", "rate", 0.01, 3), 0)])
        if answered is None:
            await asyncio.sleep(0.1)
    assert answered is not None  # Redis is used again once it is back
    await gate.close()
