"""The node tier's writer thread: the write queue and the one thread that drains it.

``NodeWriter`` is the base ``NodeCache`` (node.py) builds on: ``_enqueue`` queues a write from
the event loop (bounded by ``MAX_QUEUED`` entries), ``_drain`` runs on the writer thread and
merges consecutive writes into one transaction (a background write waits
``cache.node.write_delay_ms`` for others to share it), ``_write_retrying`` frees room on a full map
(rotating the generations) and tries again, and every ``READER_CHECK_S`` the thread frees the
reader slots of processes that died mid-read.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import lmdb

from gateway.cache.nodeadmit import NodeAdmission
from gateway.cache.nodesampled import SampledStore
from gateway.cache.nodestore import GenerationStore, KeyBytes, WriteResult

# The node tier's logger, as before the writer moved out of node.py: one name for the tier.
log = logging.getLogger("gateway.cache.node")

#: How often the writer thread frees reader slots left by processes that died mid-read.
READER_CHECK_S = 30.0
#: Entries queued for the writer thread at most; stores beyond it are dropped (a cache write).
MAX_QUEUED = 65_536

#: (op, args, future); a write nobody awaits has no future: its result goes to ``_wrote``,
#: once per transaction for all of them, not one future per write.
_Job = tuple[str, Any, "Future[Any] | None"]
#: What the writer thread reports for the writes nobody awaited in one transaction: how
#: many writes, their WriteResult (None when the transaction failed), the entries that failed,
#: and the exception (or None).
Background = tuple[int, "WriteResult | None", int, "BaseException | None"]


class WriterThread:
    """One thread that runs the functions handed to it, in order. A wake-up is one
    ``SimpleQueue.put`` (C), where a ``ThreadPoolExecutor`` made a future and a work item per
    call and ran both through its Python code on each side, once per miss. A daemon thread:
    ``shutdown`` (``NodeCache.close``) runs what was handed over and joins it; a process that
    exits without closing the tier loses the writes still queued (later misses, as in a
    crash)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._shut = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the thread; RuntimeError once shut down."""
        if self._shut:
            raise RuntimeError("cannot schedule new work after shutdown")
        self._jobs.put(fn)

    def shutdown(self) -> None:
        """Run what was handed over, then stop the thread and wait for it."""
        if not self._shut:
            self._shut = True
            self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while True:
            fn = self._jobs.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # the drain handles its own; anything else is a bug
                log.exception("node cache writer thread")


class NodeWriter:
    """The write queue and the writer thread; ``NodeCache`` sets the parts in its ``__init__``."""

    _store: GenerationStore | SampledStore
    _admit: NodeAdmission | None
    _writer: WriterThread
    _lock: threading.Lock
    _queue: list[_Job]
    _queued_items: int
    _draining: bool
    _last_reader_check: float
    _closed: bool
    _write_delay_s: float
    _timer: asyncio.TimerHandle | None

    def _wrote(self, report: Background) -> None:
        """Writer thread: the outcome of unawaited writes (``NodeCache`` sets it)."""
        raise NotImplementedError

    def _enqueue(self, op: str, args: Any, items: int) -> Future[Any]:
        fut: Future[Any] = Future()
        self._put(op, args, items, fut)
        return fut

    def _put(self, op: str, args: Any, items: int, fut: Future[Any] | None,
             later: asyncio.AbstractEventLoop | None = None) -> None:
        """Queue a job; the writer thread is started when it is not draining already. With
        ``later`` (a background write from the loop) it is started on that loop after
        ``_write_delay_s`` (0: its next turn): woken now, the writer (on the same core) would run
        ahead of the answer being sent, and the writes of the misses that come meanwhile
        share its transaction (``cache.node.write_delay_ms``). A job someone awaits starts
        a delayed drain at once."""
        if self._closed:
            raise RuntimeError("node cache is closed")
        with self._lock:
            if op == "write" and self._queued_items + items > MAX_QUEUED:
                raise RuntimeError("node cache write queue is full")
            self._queue.append((op, args, fut))
            self._queued_items += items
            start = not self._draining
            self._draining = True
        if start:
            if later is None:
                self._writer.submit(self._drain)
            elif self._write_delay_s > 0:
                self._timer = later.call_later(self._write_delay_s, self._start_drain)
            else:
                later.call_soon(self._start_drain)
        elif fut is not None:
            self._drain_now()

    def _drain_now(self) -> None:
        """A drain waiting for the write delay starts now (on the loop: an awaited job, a
        ``flush``)."""
        timer = self._timer
        if timer is not None:  # ``_start_drain`` clears it, so it has not fired
            timer.cancel()
            self._start_drain()

    def _start_drain(self) -> None:
        self._timer = None
        try:
            self._writer.submit(self._drain)
        except RuntimeError as exc:  # shut down meanwhile: what was queued fails, as a write
            with self._lock:
                jobs, self._queue, self._queued_items = self._queue, [], 0
                self._draining = False
            self._fail(jobs, exc)

    def _drain(self) -> None:
        """Writer thread: run everything queued, consecutive writes merged into one
        transaction, until the queue is empty."""
        while True:
            with self._lock:
                jobs, self._queue, self._queued_items = self._queue, [], 0
                if not jobs:
                    self._draining = False
                    return
            self._maybe_check_readers()
            batch: list[_Job] = []
            for job in jobs:
                if job[0] == "write":
                    batch.append(job)
                    continue
                self._write_batch(batch)
                batch = []
                self._alone(job)
            self._write_batch(batch)

    def _alone(self, job: _Job) -> None:
        """A delete or a purge, in a transaction of its own."""
        op, args, fut = job
        assert fut is not None  # only writes are queued without a future
        try:
            if op == "delete":
                fut.set_result(self._write_retrying([], [], args))
            else:
                fut.set_result(self._store.purge(*args))
        except BaseException as exc:
            fut.set_exception(exc)

    def _fail(self, jobs: list[_Job], exc: BaseException) -> None:
        """Fails ``jobs``: each awaited one's future, and the unawaited writes in one report."""
        for _, _, fut in jobs:
            if fut is not None:
                fut.set_exception(exc)
        unawaited = [len(ps) + len(rs) for _, (ps, rs), fut in jobs if fut is None]
        if unawaited:
            self._wrote((len(unawaited), None, sum(unawaited), exc))

    def _write_batch(self, batch: list[_Job]) -> None:
        if not batch:
            return
        puts = [p for _, (ps, _), _ in batch for p in ps]
        promotes = [r for _, (_, rs), _ in batch for r in rs]
        unawaited = [len(ps) + len(rs) for _, (ps, rs), fut in batch if fut is None]
        try:
            result, _ = self._write_retrying(puts, promotes, [])
        except BaseException as exc:
            self._fail(batch, exc)
            return
        # One transaction for the lot: each caller gets its own count, the first the evictions;
        # the unawaited writes get theirs in one report.
        first = True
        stored = 0
        for _, (ps, _), fut in batch:
            if fut is None:
                stored += len(ps)
                continue
            fut.set_result((WriteResult(len(ps), result.evicted if first else 0,
                                        result.rotations if first else 0, result.bytes,
                                        result.rejected if first else 0), 0))
            first = False
        if unawaited:
            self._wrote((len(unawaited),
                         WriteResult(stored, result.evicted if first else 0,
                                     result.rotations if first else 0, result.bytes,
                                     result.rejected if first else 0), 0, None))

    def _write_retrying(self, puts: list[tuple[KeyBytes, bytes]], promotes: list[KeyBytes],
                        deletes: list[KeyBytes]) -> tuple[WriteResult, int]:
        """One transaction; on a full map, free room (dead readers' slots and a rotation, then a
        second rotation, which leaves both generations empty) and try again."""
        if sum(len(raw) + len(value) for raw, value in puts) > self._store.generation_bytes:
            raise lmdb.MapFullError("node cache: one batch is larger than a generation")
        evicted = rotations = 0
        for attempt in range(3):
            try:
                result, deleted = self._store.write(puts, promotes, deletes, admit=self._admit)
            except lmdb.MapFullError:
                if attempt == 2:
                    raise
                if attempt == 0:
                    self._store.reader_check()
                freed = self._store.rotate()
                evicted += freed.evicted
                rotations += 1
                log.info("node cache map full; rotated generations (%d entries evicted)",
                         freed.evicted)
                continue
            if rotations:
                result = WriteResult(result.stored, result.evicted + evicted,
                                     result.rotations + rotations, result.bytes, result.rejected)
            return result, deleted
        raise AssertionError("unreachable")  # the loop returns or raises

    def _maybe_check_readers(self) -> None:
        """Free dead processes' reader slots every ``READER_CHECK_S``. A check that fails is
        logged and tried again next time: raised here, it would end the drain with the jobs it
        took unanswered and the queue marked as draining, and no write would run again."""
        now = time.monotonic()
        if now - self._last_reader_check >= READER_CHECK_S:
            self._last_reader_check = now
            try:
                cleared = self._store.reader_check()
            except lmdb.Error as exc:
                log.warning("node cache reader check failed: %s", type(exc).__name__)
                return
            if cleared:
                log.info("node cache: freed %d reader slots of dead processes", cleared)
