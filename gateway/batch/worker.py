"""The batch worker of one gateway process: a consumer of the shared Redis stream.

Every gateway process (any host) runs one; together they are the consumer group ``workers``
of ``{p}:queue``. A worker reads entries with ``XREADGROUP``, runs them, and only then
acknowledges and deletes them (``XACK`` + ``XDEL``); while it runs one it refreshes the
entry's idle time (``XCLAIM ... JUSTID`` by itself), so an entry idle for ``claim_idle_s`` has
a dead worker and any worker takes it over with ``XAUTOCLAIM``. A line whose result is already
recorded is skipped, and a result is recorded only if it is the line's first (``HSETNX``), so
an entry run twice never duplicates a line.

A line its tenant's quota refuses (gateway/batch/quota.py) either waits a moment, ends as a
``quota_exceeded`` error line, or is deferred: once every line of the entry is answered or
deferred, the entry is acknowledged and its chunk parked in ``{p}:delayed`` (a sorted set
scored by when the charge can pass) in one transaction; every worker moves due chunks back to
the stream once a second (one script: ``ZREM`` + ``XADD``, so a chunk comes back once). Its
answered lines are skipped when it runs again.

Redis errors never stop the loop: it waits (0.1 s doubling to 5 s) and carries on, and the
entries it held are taken over (by itself or another worker) once idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from gateway.batch.blobs import Blobs
from gateway.batch.finalize import Busy, Finalizer
from gateway.batch.gate import Gate, LoopLag
from gateway.batch.inputs import InputFiles
from gateway.batch.jobs import Job, JobStore
from gateway.batch.jsonl import error_line
from gateway.batch.keys import GROUP, Keys
from gateway.batch.lines import LineResult, LineRunner, Retry, line_id
from gateway.batch.quota import OverQuota, plan
from gateway.batch.scripts import PROMOTE
from gateway.settings.batch import BatchSettings
from gateway.telemetry.observer import Observer

log = logging.getLogger("gateway.batch")

_BLOCK_MS = 1000
_SAMPLE_S = 2.0
_SWEEP_S = 600.0
_FORGET_AFTER_MS = 86_400_000
_PROMOTE_S = 1.0
_PROMOTE_MAX = 100
_QUOTA_PAUSE_MIN_S = 0.05


class Worker:
    """Runs queue entries (chunks of lines, finalizations) until stopped."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, *, jobs: JobStore, runner: LineRunner,
                 gate: Gate, lag: LoopLag, finalizer: Finalizer, inputs: InputFiles, blobs: Blobs,
                 settings: BatchSettings, observer: Observer, consumer: str,
                 clock: Callable[[], float] = time.time) -> None:
        # redis-py types every reply as a union of all; here they are bytes (no decoding).
        self._redis: Any = redis
        self._keys = keys
        self._jobs = jobs
        self._runner = runner
        self._gate = gate
        self._lag = lag
        self._finalizer = finalizer
        self._inputs = inputs
        self._blobs = blobs
        self._settings = settings
        self._observer = observer
        self.consumer = consumer
        self._clock = clock
        # Enough chunks in hand to keep ``concurrency`` lines busy, and one more read ahead.
        self._max_entries = -(-settings.concurrency // settings.chunk_lines) + 1
        self._running: dict[bytes, asyncio.Task[None]] = {}
        self._promote = redis.register_script(PROMOTE)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._lag.start()
        self._task = asyncio.get_running_loop().create_task(self._main())

    async def stop(self) -> None:
        """Stop reading and drop the entries in hand: unacknowledged, they are taken over."""
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._lag.stop()

    async def _main(self) -> None:
        pause = 0.1
        next_claim = next_sample = next_sweep = next_promote = 0.0
        while True:
            try:
                await self._ensure_group()
                while True:
                    now = time.monotonic()
                    if now >= next_sample:
                        next_sample = now + _SAMPLE_S
                        await self._sample()
                    if now >= next_sweep:
                        next_sweep = now + _SWEEP_S
                        await self._blobs.sweep(self._settings.retention_s)
                        await self._forget_consumers()
                    if now >= next_promote:
                        next_promote = now + _PROMOTE_S
                        await self._promote(keys=[self._keys.delayed, self._keys.queue],
                                            args=[self._clock(), _PROMOTE_MAX])
                    free = self._max_entries - len(self._running)
                    if free <= 0:
                        await asyncio.wait(list(self._running.values()), timeout=1.0,
                                           return_when=asyncio.FIRST_COMPLETED)
                        continue
                    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
                    if now >= next_claim:
                        next_claim = now + self._settings.claim_idle_s / 2
                        entries = await self._claim(free)
                    if not entries:
                        entries = await self._read(free)
                    for entry_id, fields in entries:
                        if entry_id not in self._running:
                            self._running[entry_id] = asyncio.create_task(
                                self._entry(entry_id, fields))
                    pause = 0.1
            except (RedisError, OSError) as exc:
                log.warning("batch worker: Redis unavailable, retrying",
                            extra={"error": type(exc).__name__, "retry_in_s": pause})
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self._keys.queue, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _read(self, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        reply = await self._redis.xreadgroup(GROUP, self.consumer, {self._keys.queue: ">"},
                                             count=count, block=_BLOCK_MS)
        return [e for _stream, entries in reply or [] for e in entries]

    async def _forget_consumers(self) -> None:
        """Drop consumers of stopped processes from the group once they hold nothing (each
        process start adds one)."""
        for consumer in await self._redis.xinfo_consumers(self._keys.queue, GROUP):
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            if (name != self.consumer and int(consumer["pending"]) == 0
                    and int(consumer["idle"]) > _FORGET_AFTER_MS):
                await self._redis.xgroup_delconsumer(self._keys.queue, GROUP, name)

    async def _claim(self, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        reply = await self._redis.xautoclaim(
            self._keys.queue, GROUP, self.consumer,
            min_idle_time=int(self._settings.claim_idle_s * 1000), start_id="0-0", count=count)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = reply[1]
        if entries:
            log.info("batch worker: took over entries of a stopped worker",
                     extra={"entries": len(entries)})
        return [(i, f) for i, f in entries if f]

    async def _entry(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        heartbeat = asyncio.create_task(self._heartbeat(entry_id))
        try:
            batch_id = fields.get(b"batch", b"").decode()
            kind = fields.get(b"kind")
            later: float | None = None
            chunk = ""
            if kind == b"finalize":
                await self._finalizer.run(batch_id)
            elif kind == b"lines":
                start, count = int(fields[b"start"]), int(fields[b"count"])
                chunk = f"{batch_id}:{start}:{count}"
                later = await self._lines(batch_id, start, count)
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xack(self._keys.queue, GROUP, entry_id)
                pipe.xdel(self._keys.queue, entry_id)
                if later is not None:  # lines over quota: parked until the charge can pass
                    pipe.zadd(self._keys.delayed, {chunk: later})
                await pipe.execute()
            if later is not None:
                log.info("batch worker: lines over their tenant's quota deferred",
                         extra={"batch": batch_id, "retry_in_s": round(later - self._clock())})
        except Busy:
            pass  # another worker finalizes it; this entry is acknowledged once that is done
        except (RedisError, OSError) as exc:
            log.warning("batch worker: entry left for a retry (Redis)",
                        extra={"entry": entry_id.decode(), "error": type(exc).__name__})
        except Exception:  # a defect: logged; the entry is retried once idle
            log.exception("batch worker: entry failed", extra={"entry": entry_id.decode()})
        finally:
            heartbeat.cancel()
            self._running.pop(entry_id, None)

    async def _heartbeat(self, entry_id: bytes) -> None:
        every = self._settings.claim_idle_s / 3
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(RedisError, OSError):
                await self._redis.xclaim(self._keys.queue, GROUP, self.consumer, 0, [entry_id],
                                         justid=True)

    async def _lines(self, batch_id: str, start: int, count: int) -> float | None:
        """Run the chunk's unanswered lines; when some were deferred (over quota), the
        earliest time (wall clock) the chunk should run again."""
        job = await self._jobs.load(batch_id)
        if job is None or job.status != "in_progress":
            return None  # finished, cancelled or gone: nothing left to run
        if self._clock() > job.expires_at:
            await self._jobs.expire(batch_id)
            return None
        indexes = list(range(start, start + count))
        answered = await self._jobs.answered(batch_id, indexes)
        todo = [i for i, done in zip(indexes, answered, strict=True) if not done]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._line(job, index)) for index in todo]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        later = [when for t in tasks if (when := t.result()) is not None]
        return min(later) if later else None

    async def _line(self, job: Job, index: int) -> float | None:
        """Answer one line; or the time to try it again when its tenant's quota defers it."""
        lines = await self._inputs.lines(job.input_file_id)
        if lines is None or index >= len(lines):
            result = LineResult(False, error_line(
                line_id(job.id, index), None, "input_file_missing",
                "the batch's input file is gone", index + 1))
        else:
            number, raw = lines[index]
            wait = 0.1
            while True:
                try:
                    async with self._gate:
                        result = await self._runner.run(
                            batch_id=job.id, tenant=job.tenant, endpoint=job.endpoint,
                            index=index, number=number, raw=raw)
                    break
                except Retry:
                    self._observer.batch_lines("retried", 1)
                    pause = wait
                    wait = min(wait * 2, self._settings.retry_max_s)
                except OverQuota as over:
                    action = plan(over, now=self._clock(), expires_at=job.expires_at,
                                  sleep_max_s=self._settings.retry_max_s)
                    self._observer.batch_lines(f"quota_{action}", 1)
                    if action == "fail":
                        self._observer.tenant_request(job.tenant, "rate_limited")
                        result = LineResult(False, over.line)
                        break
                    if action == "defer":
                        return self._clock() + over.retry_s
                    # The charge passes then: no polling meanwhile (and never a tight loop).
                    pause = max(over.retry_s, _QUOTA_PAUSE_MIN_S)
                await asyncio.sleep(pause)
                current = await self._jobs.load(job.id)
                if current is None or current.status != "in_progress":
                    return None
                if self._clock() > current.expires_at:  # retried for its whole window
                    await self._jobs.expire(job.id)
                    return None
        if await self._jobs.record(job.id, index, result.ok, result.line) == 1:
            self._observer.batch_lines("completed" if result.ok else "failed", 1)
        return None

    async def _sample(self) -> None:
        counts, remaining = await self._jobs.overview()
        oldest = await self._redis.xrange(self._keys.queue, count=1)
        lag = 0.0
        if oldest:
            ms = int(oldest[0][0].split(b"-")[0])
            lag = max(0.0, self._clock() - ms / 1000.0)
        self._observer.batch_queue(remaining, lag, counts)
