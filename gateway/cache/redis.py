"""L2: the Redis tier shared by every gateway replica, guarded by a timeout and a circuit breaker.

``redis.asyncio`` with the hiredis parser (picked automatically when installed), one pooled
client per tier: standalone (``redis://``, ``rediss://`` for TLS, ``unix://``) or Redis Cluster.
Batches: one MGET per lookup (``mget_nonatomic`` in a cluster, whose keys span slots), one
non-transactional pipeline of ``SET PX`` per store, where the expiry is the entry's
``expires_at`` so Redis drops it when no tier could still serve it.

Request-path calls never raise: each is bounded by ``timeout_s`` (+ ``connect_timeout_s`` when
a connection has to be made) and any redis, socket or timeout error becomes a miss or a dropped
write. After ``failure_threshold`` consecutive failures the breaker opens and Redis is skipped
for ``open_s``; then one probe decides. The pool replaces broken connections on its own, so
recovery needs nothing from the caller. Keys and values are never logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.cache.base import CacheUnavailable
from gateway.cache.breaker import CircuitBreaker
from gateway.cache.entry import CacheCorrupt, Entry
from gateway.cache.keys import CacheKey, scope_tag
from gateway.cache.settings import RedisSettings
from gateway.telemetry.observer import NullObserver, Observer

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Admin operations (purge) may take longer than a lookup; each of their commands gets this.
BULK_TIMEOUT_S = 5.0
SCAN_COUNT = 1000
_GLOB = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def _escape(part: str) -> str:
    return part.translate(_GLOB)


class RedisCache:
    """The L2 tier (see the module docstring). ``name`` is ``"l2"``."""

    name = "l2"

    def __init__(
        self,
        settings: RedisSettings,
        *,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._observer: Observer = observer or NullObserver()
        self._deadline = settings.timeout_s + settings.connect_timeout_s
        self.breaker = CircuitBreaker(
            failure_threshold=settings.failure_threshold, open_s=settings.open_s,
            on_change=self._on_breaker_change,
        )
        self._observer.circuit_open(False)
        # One immediate retry, on connection errors only: after a Redis restart or failover
        # every pooled connection is dead, and the pool does not notice until it uses one
        # (verified with hiredis); without the retry each of them would count towards opening
        # the breaker although Redis is back. Timeouts are never retried: the breaker decides.
        common: dict[str, Any] = {
            "socket_timeout": settings.timeout_s,
            "socket_connect_timeout": settings.connect_timeout_s,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "max_connections": settings.max_connections,
        }
        self._cluster = settings.is_cluster
        self._client: aioredis.Redis | RedisCluster
        if self._cluster:
            self._client = RedisCluster.from_url(settings.client_url, **common)
        else:
            # A blocking pool: a burst beyond max_connections waits (within the timeout)
            # instead of failing with "Too many connections" and tripping the breaker.
            pool = aioredis.BlockingConnectionPool.from_url(
                settings.client_url, timeout=settings.timeout_s, **common
            )
            self._client = aioredis.Redis.from_pool(pool)

    @property
    def circuit_open(self) -> bool:
        return self.breaker.is_open

    def _on_breaker_change(self, is_open: bool) -> None:
        if is_open:
            log.warning("redis circuit opened after %d failures; skipping L2 for %.1fs",
                        self.breaker.failures, self.settings.open_s)
        else:
            log.info("redis circuit closed; L2 back in use")
        self._observer.circuit_open(is_open)

    def _key(self, key: CacheKey) -> str:
        return key.redis_key(self.settings.key_prefix)

    async def _guarded(self, op: str, call: Callable[[], Awaitable[T]]) -> tuple[T | None, bool]:
        """Run one Redis call under the breaker and the deadline: (result, ok), never raising."""
        if not self.breaker.allow():
            return None, False
        try:
            async with asyncio.timeout(self._deadline):
                result = await call()
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        except Exception as exc:  # any failure of the tier is a miss, by contract
            self.breaker.failure()
            self._count_error()
            if isinstance(exc, RedisError | OSError | TimeoutError):
                log.debug("redis %s failed: %s", op, type(exc).__name__)
            else:  # not an outage: more likely a bug, so make it visible (type only, no data)
                log.warning("redis %s raised unexpected %s", op, type(exc).__name__)
            return None, False
        self.breaker.success()
        return result, True

    def _count_error(self) -> None:
        self._observer.cache_errors("l2", 1)

    # -- lookups -----------------------------------------------------------------------------

    async def lookup(self, keys: Sequence[CacheKey]) -> tuple[list[Entry | None], bool]:
        """Like ``get_many``, plus whether Redis answered (False: down, slow or circuit open)."""
        if not keys:
            return [], True
        names = [self._key(k) for k in keys]
        if self._cluster:
            client: Any = self._client
            raw, ok = await self._guarded("mget", lambda: client.mget_nonatomic(names))
        else:
            raw, ok = await self._guarded("mget", lambda: self._client.mget(names))
        if not ok or raw is None:
            return [None] * len(keys), False
        now = self._clock()
        out: list[Entry | None] = []
        corrupt = 0
        for blob in raw:
            if blob is None:
                out.append(None)
                continue
            try:
                # A str here means the URL asked for decode_responses: unusable, not a crash.
                if not isinstance(blob, bytes):
                    raise CacheCorrupt("redis returned text, not bytes")
                entry = Entry.decode(blob)
            except CacheCorrupt:
                corrupt += 1
                out.append(None)
                continue
            # Another replica's clock may differ: never hand out what is already gone.
            out.append(entry if entry.expires_at > now else None)
        if corrupt:
            log.warning("redis returned %d corrupt cache entries; treated as misses", corrupt)
            self._observer.cache_errors("l2", corrupt)
        return out, True

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Entry | None]:
        return (await self.lookup(keys))[0]

    # -- writes ------------------------------------------------------------------------------

    async def store(self, items: Sequence[tuple[CacheKey, Entry]]) -> int:
        """Like ``set_many``; returns how many entries were written (0 when Redis is out)."""
        now = self._clock()
        writes: list[tuple[str, bytes, int]] = []
        for key, entry in items:
            px = int((entry.expires_at - now) * 1000)
            if px > 0:
                writes.append((self._key(key), entry.encode(), px))
        if not writes:
            return 0

        async def run() -> None:
            pipe = self._client.pipeline(transaction=False)
            for name, blob, px in writes:
                pipe.set(name, blob, px=px)
            await pipe.execute()

        _, ok = await self._guarded("set", run)
        return len(writes) if ok else 0

    async def set_many(self, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        await self.store(items)

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        if not keys:
            return 0
        names = [self._key(k) for k in keys]
        count, ok = await self._guarded("unlink", lambda: self._client.unlink(*names))
        return int(count) if ok and count is not None else 0

    async def ping(self) -> bool:
        """True when Redis answers now (for readiness and start-up logs); never raises."""
        _, ok = await self._guarded("ping", self._ping)
        return ok

    async def _ping(self) -> None:
        await self._client.ping()

    # -- admin -------------------------------------------------------------------------------

    def purge_pattern(self, *, model: str | None, scope: str | None) -> str:
        """The SCAN MATCH pattern for a purge (``None`` = any model / scope)."""
        prefix = _escape(self.settings.key_prefix)
        m = "*" if model is None else _escape(model)
        s = "*" if scope is None else scope_tag(scope)
        return f"{prefix}:{m}:{s}:*"

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        """Remove matching entries with SCAN MATCH + UNLINK in batches; returns the count.

        Raises ``CacheUnavailable`` when Redis is unreachable (or the circuit is open) so an
        admin never believes a purge happened when it did not. Safe to repeat.
        """
        if not self.breaker.allow():
            raise CacheUnavailable("redis is unavailable (circuit open); purge not done")
        pattern = self.purge_pattern(model=model, scope=scope)
        prefix = self.settings.key_prefix
        tag = None if scope is None else scope_tag(scope)
        removed = 0
        batch: list[bytes] = []
        try:
            # scan_iter is an async generator in both clients; closed explicitly below.
            scan = cast(
                AsyncGenerator[bytes, None],
                self._client.scan_iter(match=pattern, count=SCAN_COUNT),
            )
            try:
                while True:
                    try:
                        async with asyncio.timeout(BULK_TIMEOUT_S):
                            name = await anext(scan)
                    except StopAsyncIteration:
                        break
                    if _matches(name, prefix, model, tag):
                        batch.append(name)
                    if len(batch) >= SCAN_COUNT:
                        removed += await self._unlink_batch(batch)
                        batch = []
                if batch:
                    removed += await self._unlink_batch(batch)
            finally:
                await scan.aclose()
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        except Exception as exc:
            self.breaker.failure()
            self._count_error()
            raise CacheUnavailable(
                f"redis purge failed after removing {removed} entries: {type(exc).__name__}"
            ) from exc
        self.breaker.success()
        return removed

    async def _unlink_batch(self, names: list[bytes]) -> int:
        async with asyncio.timeout(BULK_TIMEOUT_S):
            return int(await self._client.unlink(*names))

    async def close(self) -> None:
        await self._client.aclose()


def _matches(name: bytes, prefix: str, model: str | None, tag: str | None) -> bool:
    # The pattern alone is not exact: a model named "a:b" also matches "prefix:a:*". Keys end
    # in ":{tag}:{digest}", so split from the right to recover the model exactly.
    text = name.decode("utf-8", "replace")
    if not text.startswith(prefix + ":"):
        return False
    parts = text[len(prefix) + 1:].rsplit(":", 2)
    if len(parts) != 3:
        return False
    return (model is None or parts[0] == model) and (tag is None or parts[1] == tag)
