"""Batches: creating one (its lines queued in chunks), reading, listing, cancelling, recording
line results exactly once, and the status moves.

Statuses (OpenAI's)::

    validating -> in_progress -> finalizing -> completed
                      |  \\-> (past its completion window) finalizing -> expired
                      \\-> cancelling -> cancelled

``validating`` lasts only while ``POST /v1/batches`` checks the request: the batch record, its
queue entries and its move to ``in_progress`` are written in one transaction, so no worker ever
sees half a batch. A batch is never failed for overload: its lines wait and are retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.batch import scripts
from gateway.batch.errors import Conflict
from gateway.batch.files import READER, FileMeta
from gateway.batch.keys import Keys, is_batch_id, new_batch_id
from gateway.errors import NotFound, RateLimited
from gateway.settings.batch import BatchSettings

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "cancelled", "expired")
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
          "failed_at", "expired_at", "cancelling_at", "cancelled_at")


@dataclass(frozen=True, slots=True)
class Job:
    """One batch as stored (``{p}:batch:{id}``)."""

    id: str
    fields: Mapping[str, str]

    @property
    def tenant(self) -> str:
        return self.fields["tenant"]

    @property
    def status(self) -> str:
        return self.fields["status"]

    @property
    def endpoint(self) -> str:
        return self.fields["endpoint"]

    @property
    def input_file_id(self) -> str:
        return self.fields["input_file_id"]

    @property
    def total(self) -> int:
        return int(self.fields.get("total", "0"))

    def count(self, name: str) -> int:
        return int(self.fields.get(name, "0") or 0)

    @property
    def expires_at(self) -> int:
        return int(self.fields["expires_at"])

    def view(self) -> dict[str, Any]:
        """The OpenAI ``batch`` object."""
        f = self.fields
        out: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": None,
            "input_file_id": self.input_file_id, "completion_window": f["completion_window"],
            "status": self.status, "output_file_id": f.get("output_file_id") or None,
            "error_file_id": f.get("error_file_id") or None,
            "request_counts": {"total": self.total, "completed": self.count("completed"),
                               "failed": self.count("failed")},
            "metadata": orjson.loads(f.get("metadata", "null")),
        }
        for name in _TIMES:
            out[name] = int(f[name]) if f.get(name) else None
        return out


def _decode(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


class JobStore:
    """Reads and changes batches in Redis; every check-then-write is one Lua script."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: BatchSettings, *,
                 clock: Callable[[], float] = time.time) -> None:
        # redis-py types every reply as a union of all; here they are bytes (no decoding).
        self._redis: Any = redis
        self._keys = keys
        self._settings = settings
        self._clock = clock
        self._admit = redis.register_script(scripts.ADMIT_BATCH)
        self._record = redis.register_script(scripts.RECORD)
        self._transition = redis.register_script(scripts.TRANSITION)

    def _ttl_ms(self, window_s: float = 0.0) -> int:
        return int((window_s + self._settings.retention_s) * 1000)

    async def create(self, tenant: str, source: FileMeta, *, endpoint: str, window: str,
                     window_s: float, metadata: Mapping[str, str] | None) -> Job:
        """A new batch over ``source``, queued in chunks of ``batch.chunk_lines`` lines (429 when
        the tenant has ``batch.max_active_batches`` unfinished)."""
        batch_id = new_batch_id()
        k = self._keys
        limit = self._settings.max_active_batches
        if not await self._admit(keys=[k.tenant_active(tenant), k.active],
                                 args=[batch_id, limit]):
            raise RateLimited(f"tenant has {limit} unfinished batches, the limit "
                              "(batch.max_active_batches); wait for one to finish", 30.0)
        now = self._clock()
        fields = {
            "tenant": tenant, "status": "in_progress", "endpoint": endpoint,
            "input_file_id": source.id, "completion_window": window,
            "created_at": int(now), "in_progress_at": int(now),
            "expires_at": int(now + window_s), "total": source.lines, "completed": 0,
            "failed": 0, "metadata": orjson.dumps(metadata).decode(),
        }
        step = self._settings.chunk_lines
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(k.batch(batch_id), mapping=fields)
                pipe.pexpire(k.batch(batch_id), self._ttl_ms(window_s))
                pipe.zadd(k.tenant_batches(tenant), {batch_id: now})
                pipe.pexpire(k.tenant_batches(tenant), self._ttl_ms(window_s))
                pipe.hset(k.file(source.id), READER + batch_id, 1)
                for start in range(0, source.lines, step):
                    pipe.xadd(k.queue, {"kind": "lines", "batch": batch_id, "start": start,
                                        "count": min(step, source.lines - start)})
                await pipe.execute()
        except BaseException:
            await self._release(tenant, batch_id)
            raise
        return Job(batch_id, {k2: str(v) for k2, v in fields.items()})

    async def load(self, batch_id: str) -> Job | None:
        """A batch by id, whoever owns it (the worker's view)."""
        raw = await self._redis.hgetall(self._keys.batch(batch_id))
        return Job(batch_id, _decode(raw)) if raw else None

    async def get(self, tenant: str, batch_id: str) -> Job:
        """The tenant's batch, or 404 (also for another tenant's id)."""
        job = await self.load(batch_id) if is_batch_id(batch_id) else None
        if job is None or job.tenant != tenant:
            raise NotFound(f"no batch {batch_id!r}")
        return job

    async def active(self, batch_id: str) -> bool:
        job = await self.load(batch_id)
        return job is not None and job.status in ACTIVE

    async def page(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[Job], bool]:
        """The tenant's batches, newest first, after the id ``after``; and whether more follow."""
        key = self._keys.tenant_batches(tenant)
        start = 0
        if after is not None:
            rank = await self._redis.zrevrank(key, after)
            if rank is None:
                raise NotFound(f"no batch {after!r} to list after")
            start = rank + 1
        found: list[Job] = []
        while len(found) <= limit:
            ids = await self._redis.zrevrange(key, start, start + limit)
            if not ids:
                break
            start += len(ids)
            for raw_id in ids:
                job = await self.load(raw_id.decode())
                if job is None:  # expired: forget it
                    await self._redis.zrem(key, raw_id)
                    start -= 1
                elif len(found) <= limit:
                    found.append(job)
        return found[:limit], len(found) > limit

    async def cancel(self, tenant: str, batch_id: str) -> Job:
        """Ask a batch to stop: ``cancelling`` now, ``cancelled`` once its finalize entry runs
        (lines already answered are kept); 409 for a batch already finished or finalizing."""
        job = await self.get(tenant, batch_id)
        before = await self.transition(batch_id, ("validating", "in_progress"),
                                       status="cancelling", cancelling_at=int(self._clock()))
        if before is None:
            job = await self.get(tenant, batch_id)
            if job.status in ("cancelling", "cancelled"):
                return job
            raise Conflict(f"batch {batch_id!r} is {job.status}; it can no longer be cancelled")
        await self._redis.xadd(self._keys.queue, {"kind": "finalize", "batch": batch_id})
        return await self.get(tenant, job.id)

    async def expire(self, batch_id: str) -> None:
        """A batch past its completion window: finalize what it has (``expired``)."""
        if await self.transition(batch_id, ("in_progress",), status="finalizing",
                                 finalizing_at=int(self._clock()), ending="expired"):
            await self._redis.xadd(self._keys.queue, {"kind": "finalize", "batch": batch_id})

    async def record(self, batch_id: str, index: int, ok: bool, line: bytes) -> int:
        """A line's result, kept only if it is the line's first (1); 0 when it already had one,
        -1 when the batch takes no more results."""
        k = self._keys
        marked = (b"o" if ok else b"e") + line
        return int(await self._record(
            keys=[k.batch(batch_id), k.results(batch_id), k.queue],
            args=[index, marked, "completed" if ok else "failed", int(self._clock()), batch_id,
                  self._ttl_ms(86_400.0)]))

    async def answered(self, batch_id: str, indexes: list[int]) -> list[bool]:
        """Which of the lines already have a result (a chunk delivered again skips them)."""
        if not indexes:
            return []
        found = await self._redis.hmget(self._keys.results(batch_id), indexes)
        return [v is not None for v in found]

    async def lock(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        """Take (or, for its owner, extend) the batch's finalization lock; False while another
        worker holds it. Two finalizations at once would interleave their file writes."""
        key = self._keys.finalizing(batch_id)
        if await self._redis.set(key, owner, nx=True, px=int(ttl_s * 1000)):
            return True
        held = await self._redis.get(key)
        if held == owner.encode():
            await self._redis.pexpire(key, int(ttl_s * 1000))
            return True
        return False

    async def results(self, batch_id: str, indexes: list[int]) -> list[bytes | None]:
        found: list[bytes | None] = await self._redis.hmget(self._keys.results(batch_id),
                                                            indexes)
        return found

    async def transition(self, batch_id: str, allowed: tuple[str, ...],
                         **fields: str | int) -> str | None:
        """Set ``fields`` if the batch's status is one of ``allowed``; the status before, or
        None when it was not."""
        args: list[str | int] = [",".join(allowed)]
        for name, value in fields.items():
            args += [name, value]
        before = await self._transition(keys=[self._keys.batch(batch_id)], args=args)
        return before.decode() if isinstance(before, bytes) else None

    async def finished(self, job: Job) -> None:
        """After the final status: the batch leaves the active sets; its results go."""
        k = self._keys
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.results(job.id), k.finalizing(job.id))
            pipe.pexpire(k.batch(job.id), self._ttl_ms())
            pipe.hdel(k.file(job.input_file_id), READER + job.id)
            await pipe.execute()
        await self._release(job.tenant, job.id)

    async def _release(self, tenant: str, batch_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(self._keys.tenant_active(tenant), batch_id)
            pipe.srem(self._keys.active, batch_id)
            await pipe.execute()

    async def overview(self) -> tuple[dict[str, int], int]:
        """Unfinished batches by status over every tenant, and the lines they still have to
        run (the status gauge and the queue depth)."""
        counts = dict.fromkeys(ACTIVE, 0)
        remaining = 0
        for raw in await self._redis.smembers(self._keys.active):
            job = await self.load(raw.decode())
            if job is not None and job.status in counts:
                counts[job.status] += 1
                remaining += max(0, job.total - job.count("completed") - job.count("failed"))
        return counts, remaining
