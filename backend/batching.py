"""Dynamic batching: one bounded queue of items per model, merged into batches, split back.

Callers ``await batcher.submit(items)``; the batcher owns everything else, so model code only
ever sees ``compute(list_of_items) -> results`` (run in a worker thread, off the event loop):

- Dispatch when a worker is free. A request that finds a worker idle is computed at once, alone
  if it is alone: a lone request never waits for company. While every worker computes, arrivals
  wait and form the next batch, which the first worker to free up takes at once (up to
  ``max_batch_size`` items). So batches fill up by themselves under load and nothing waits when
  idle: Triton's dynamic batcher with no queue delay.
- Items are grouped by size (token length) to cut padding: under a backlog the batch is the
  run of ``max_batch_size`` length-sorted items that holds the oldest item (so nothing starves)
  with the least padding, and a batch of very mixed lengths is cut into a few calls when the
  saved padding outweighs a call's overhead (``split_cost``, in size units); with
  ``max_call_size``, no call covers more padded size units than that (one item at least).
- The queue is bounded in items: ``submit`` raises ``QueueFull`` at once rather than grow.
- Deadlines: a request whose deadline passes while queued is dropped before compute and its
  caller gets ``DeadlineExpired``; a cancelled caller's items are dropped too.
- One request's items may land in several batches; results come back in the request's order.

Hand-offs, per batch: one ``executor.submit`` to a worker thread, and one
``call_soon_threadsafe`` back, which resolves the callers' futures and dispatches the next
batch in the same callback. There is no batching task and no task per batch: a lone request
costs exactly one thread hand-off each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from backend.grouping import next_batch, plan_groups

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("backend.batching")


class BatchingError(Exception):
    """Base of the batcher's own errors (callers map them to their protocol)."""


class QueueFull(BatchingError):
    """The queue cannot take the request now; ``retry_after_s`` estimates when it could."""

    def __init__(self, depth: int, capacity: int, retry_after_s: float) -> None:
        super().__init__(f"queue full: {depth} of {capacity} items waiting")
        self.retry_after_s = retry_after_s


class DeadlineExpired(BatchingError):
    """The request's deadline passed before its items were computed."""


class BatcherClosed(BatchingError):
    """The batcher is shutting down."""


@dataclass(frozen=True, slots=True)
class BatchOutcome(Generic[R]):
    """One request's results in its own order, with where its time went."""

    results: list[R]
    queue_s: float  # time in the batcher not spent computing this request's batches
    compute_s: float  # compute time of the batches that carried its items
    batch_size: int  # the largest batch that carried its items


class BatchObserver(Protocol):
    """Hooks for metrics; the batcher calls them on the event loop. (The queue depth is read,
    not pushed: ``depth``.)"""

    def batch_computed(self, size: int, compute_s: float) -> None: ...


class _NullObserver:
    def batch_computed(self, size: int, compute_s: float) -> None:
        pass


class _Request:
    __slots__ = ("batch_size", "compute_s", "deadline", "enqueued", "future", "remaining",
                 "results")

    def __init__(self, future: asyncio.Future[Any], n: int, deadline: float | None,
                 enqueued: float) -> None:
        self.future = future
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.deadline = deadline
        self.enqueued = enqueued
        self.compute_s = 0.0
        self.batch_size = 0


@dataclass(slots=True, eq=False)  # identity, not field, equality: items may be arrays
class _Slot:
    req: _Request
    index: int  # position in the request
    item: Any
    size: int
    seq: int  # arrival order across requests


# What a worker hands back: per group its results and compute seconds, or the exception.
_Outputs = list[tuple[Sequence[Any], float]]


class DynamicBatcher(Generic[T, R]):
    """Batches items from concurrent ``submit`` calls into ``compute`` calls; see module doc."""

    def __init__(
        self,
        compute: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int,
        max_queue_size: int,
        size_of: Callable[[T], int] = lambda _: 1,
        workers: int = 1,
        split_cost: float = 32.0,
        max_call_size: int | None = None,
        observer: BatchObserver | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1 or max_queue_size < 1 or workers < 1:
            raise ValueError("batch size, queue size and workers must be >= 1")
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.workers = workers
        self._compute = compute
        self._size_of = size_of
        self._split_cost = split_cost
        self._max_call_size = max_call_size
        self._observer: BatchObserver = observer or _NullObserver()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-compute")
        self._idle = workers  # workers not computing a batch
        self._pending: list[_Slot] = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Future[None] | None = None  # set by close() while batches run
        self._closed = False
        self._item_s = 0.0  # EWMA of compute seconds per item, for Retry-After estimates

    @property
    def depth(self) -> int:
        """Items waiting (not yet in a batch)."""
        return len(self._pending)

    @property
    def busy_workers(self) -> int:
        """Workers computing a batch now."""
        return self.workers - self._idle

    def start(self) -> None:
        """Binds the batcher to the running event loop; call from inside it before ``submit``."""
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        """Fails what is still queued with ``BatcherClosed``, waits for running batches."""
        self._closed = True
        for slot in self._pending:
            _fail(slot.req, BatcherClosed("shutting down"))
        self._pending.clear()
        if self._idle < self.workers:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        self._executor.shutdown(wait=False)

    def estimated_wait_s(self, extra_items: int = 0) -> float:
        """Rough time to drain the queue (plus ``extra_items``), from recent compute speed."""
        return (self.depth + extra_items) * self._item_s / self.workers

    async def submit(
        self, items: Sequence[T], *, timeout_s: float | None = None
    ) -> BatchOutcome[R]:
        """Queues ``items`` and waits for their results (in order).

        Raises ``QueueFull`` at once when they do not fit, ``DeadlineExpired`` when
        ``timeout_s`` passes first, ``BatcherClosed`` on shutdown, and whatever ``compute``
        raised for a batch that carried them.
        """
        if self._closed:
            raise BatcherClosed("shutting down")
        n = len(items)
        if not n:
            return BatchOutcome([], 0.0, 0.0, 0)
        if len(self._pending) + n > self.max_queue_size:
            raise QueueFull(len(self._pending), self.max_queue_size, self.estimated_wait_s(n))
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExpired("deadline passed before queueing")
        loop = self._loop
        if loop is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        future: asyncio.Future[BatchOutcome[R]] = loop.create_future()
        now = time.monotonic()
        req = _Request(future, n, None if timeout_s is None else now + timeout_s, now)
        size_of, seq, pending = self._size_of, self._seq, self._pending
        for index, item in enumerate(items):
            pending.append(_Slot(req, index, item, size_of(item), next(seq)))
        if self._idle:  # a free worker takes it now, not a loop turn later
            self._dispatch()
        # One timer handle, not asyncio.timeout's task cancellation: it fails the future.
        timer = None if timeout_s is None or future.done() else \
            loop.call_later(timeout_s, self._expire, req, timeout_s)
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(req)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, req: _Request, timeout_s: float) -> None:
        """The request's deadline passed before all its results came: it leaves the queue."""
        if not req.future.done():
            self._abandon(req)
            req.future.set_exception(
                DeadlineExpired(f"deadline of {timeout_s * 1000:.0f} ms passed"))

    def _abandon(self, req: _Request) -> None:
        if any(slot.req is req for slot in self._pending):
            self._pending = [slot for slot in self._pending if slot.req is not req]

    def _dispatch(self) -> None:
        """Hands batches to idle workers while both exist (on the event loop)."""
        loop = self._loop
        while loop is not None and self._idle and self._pending and not self._closed:
            batch = self._take()
            if not batch:
                return
            bounds = plan_groups([slot.size for slot in batch], self._split_cost,
                                 self._max_call_size)
            groups = [[slot.item for slot in batch[lo:hi]] for lo, hi in bounds]
            self._idle -= 1
            try:
                self._executor.submit(self._work, loop, batch, bounds, groups)
            except RuntimeError as exc:  # the executor is shut down
                self._idle += 1
                for slot in batch:
                    _fail(slot.req, BatcherClosed(str(exc)))
                return

    def _take(self) -> list[_Slot]:
        """Drops expired and abandoned requests, then picks the next batch (sorted by size)."""
        now = time.monotonic()
        live: list[_Slot] = []
        for slot in self._pending:
            req = slot.req
            if req.future.done():
                continue
            if req.deadline is not None and req.deadline <= now:
                _fail(req, DeadlineExpired("deadline passed while queued"))
                continue
            live.append(slot)
        batch, self._pending = next_batch(live, [s.size for s in live], self.max_batch_size)
        return batch

    def _work(self, loop: asyncio.AbstractEventLoop, batch: list[_Slot],
              bounds: list[tuple[int, int]], groups: list[list[T]]) -> None:
        """In a worker thread: computes every group, then hands the outcome to the loop."""
        outputs: _Outputs | None = None
        error: BaseException | None = None
        try:
            outputs = _compute_groups(self._compute, groups)
        except Exception as exc:  # the callers get it
            error = exc
        except BaseException as exc:  # never strand the callers, whatever was raised
            error = RuntimeError(f"compute raised {type(exc).__name__}")
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
            loop.call_soon_threadsafe(self._finished, batch, bounds, outputs, error)

    def _finished(self, batch: list[_Slot], bounds: list[tuple[int, int]],
                  outputs: _Outputs | None, error: BaseException | None) -> None:
        """On the loop: delivers a batch's results, frees its worker, dispatches the next."""
        self._idle += 1
        try:
            if outputs is None:
                for slot in batch:
                    _fail(slot.req, error or RuntimeError("compute gave no result"))
            else:
                for (lo, hi), (results, compute_s) in zip(bounds, outputs, strict=True):
                    self._record(batch[lo:hi], results, compute_s)
        except Exception as exc:  # a bug here must not strand the batch's callers
            log.error("delivering a batch failed", exc_info=exc)
            for slot in batch:
                _fail(slot.req, exc)
        if self._drained is not None and self._idle == self.workers:
            if not self._drained.done():
                self._drained.set_result(None)
            return
        self._dispatch()

    def _record(self, group: list[_Slot], results: Sequence[R], compute_s: float) -> None:
        self._observer.batch_computed(len(group), compute_s)
        self._item_s = 0.8 * self._item_s + 0.2 * (compute_s / len(group))
        if len(results) != len(group):
            error = RuntimeError(f"compute returned {len(results)} results for {len(group)} items")
            for slot in group:
                _fail(slot.req, error)
            return
        charged: set[int] = set()
        now = time.monotonic()
        for slot, result in zip(group, results, strict=True):
            req = slot.req
            if req.future.done():
                continue
            req.results[slot.index] = result
            if id(req) not in charged:
                charged.add(id(req))
                req.compute_s += compute_s
                req.batch_size = max(req.batch_size, len(group))
            req.remaining -= 1
            if req.remaining == 0:
                queue_s = max(0.0, now - req.enqueued - req.compute_s)
                req.future.set_result(
                    BatchOutcome(req.results, queue_s, req.compute_s, req.batch_size)
                )


def _fail(req: _Request, exc: BaseException) -> None:
    if not req.future.done():
        req.future.set_exception(exc)


def _compute_groups(
    compute: Callable[[list[T]], Sequence[R]], groups: list[list[T]]
) -> _Outputs:
    """Runs in the worker thread: one ``compute`` call per group, each timed."""
    out: _Outputs = []
    for items in groups:
        started = time.perf_counter()
        results = compute(items)
        out.append((results, time.perf_counter() - started))
    return out
