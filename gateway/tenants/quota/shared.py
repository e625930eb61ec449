"""The shared limiter: every gateway process and host charges the same counters in Redis.

One ``EVALSHA`` of gateway/tenants/quota/script.py per check (redis-py's ``Script`` loads it again
after
a Redis restart flushed the script cache), under ``redis.timeout_s`` and a circuit breaker of
its own, built like the cache's (gateway/cache/redis.py): any redis, socket or timeout error,
and every call while the breaker is open, answers ``None`` and the caller falls back to the
local limiter. Never raises on the request path, never logs a key or a tenant id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from gateway.cache.breaker import CircuitBreaker
from gateway.cache.keys import scope_tag
from gateway.cache.settings import RedisSettings
from gateway.tenants.quota.gcra import Verdict
from gateway.tenants.quota.local import Charge
from gateway.tenants.quota.script import SCRIPT

log = logging.getLogger("gateway.tenants.quota")


def quota_key(prefix: str, tenant: str, limit: str) -> str:
    """``{prefix}:quota:{<scope_tag>}/{limit}``: the tenant only as its hash, in a hash tag;
    one colon fewer than a cache key, so no cache purge pattern matches it."""
    return f"{prefix}:quota:{{{scope_tag(tenant)}}}/{limit}"


class SharedLimiter:
    """Limits kept in Redis (see the module docstring)."""

    def __init__(self, settings: RedisSettings, *,
                 on_breaker: Callable[[bool], None] | None = None) -> None:
        self._prefix = settings.key_prefix
        self._deadline = settings.timeout_s + settings.connect_timeout_s
        self.breaker = CircuitBreaker(failure_threshold=settings.failure_threshold,
                                      open_s=settings.open_s, on_change=self._changed)
        self._on_breaker = on_breaker
        common: dict[str, Any] = {"socket_timeout": settings.timeout_s,
                                  "socket_connect_timeout": settings.connect_timeout_s}
        self._client: aioredis.Redis | RedisCluster
        if settings.is_cluster:
            self._client = RedisCluster.from_url(settings.client_url, **common)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(
                settings.client_url, timeout=settings.timeout_s,
                max_connections=settings.max_connections, **common)
            self._client = aioredis.Redis.from_pool(pool)
        self._script = self._client.register_script(SCRIPT)

    def _changed(self, is_open: bool) -> None:
        if is_open:
            log.warning("quota redis unreachable: local limits apply for %.1fs",
                        self.breaker.open_s)
        else:
            log.info("quota redis reachable again: shared limits apply")
        if self._on_breaker is not None:
            self._on_breaker(is_open)

    async def apply(self, tenant: str, charges: Sequence[Charge]) -> list[Verdict] | None:
        """Every limit's verdict (charged all or none), or None when Redis did not answer."""
        if not self.breaker.allow():
            return None
        keys = [quota_key(self._prefix, tenant, limit.name) for limit, _ in charges]
        args: list[Any] = [len(charges)]
        for limit, cost in charges:
            if limit.kind == "rate":
                args += ["r", cost, 1_000_000.0 / limit.amount, limit.burst]
            else:
                args += ["d", cost, limit.amount, 0]
        try:
            async with asyncio.timeout(self._deadline):
                reply = await self._script(keys=keys, args=args)
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        except Exception as exc:  # any failure: the local limiter answers instead
            self.breaker.failure()
            if not isinstance(exc, RedisError | OSError | TimeoutError):
                log.warning("quota script raised unexpected %s", type(exc).__name__)
            return None
        try:
            values = [int(v) for v in reply]
            verdicts = [Verdict(values[i] == 1, values[i + 1], values[i + 2] / 1000.0,
                                values[i + 3] / 1000.0) for i in range(1, len(values), 4)]
        except (TypeError, ValueError, IndexError):
            self.breaker.failure()
            log.warning("quota script answered in an unexpected shape")
            return None
        if len(verdicts) != len(charges):
            self.breaker.failure()
            return None
        self.breaker.success()
        return verdicts

    async def close(self) -> None:
        await self._client.aclose()
