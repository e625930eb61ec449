"""Dynamic batching: one bounded queue of items per model, merged into batches, split back.

Callers ``await batcher.submit(items)``; the batcher owns everything else, so model code only
ever sees ``compute(list_of_items) -> results`` (run in a worker thread, off the event loop):

- A batch is released when it is full (at once) or when its oldest item has waited
  ``max_queue_delay_s``. While the worker computes, the next batch gathers, so under load
  batches fill up by themselves.
- Items are grouped by size (token length) to cut padding: under a backlog the batch is the
  run of ``max_batch_size`` length-sorted items that holds the oldest item (so nothing starves)
  with the least padding, and a batch of very mixed lengths is cut into a few calls when the
  saved padding outweighs a call's overhead (``split_cost``, in size units).
- The queue is bounded in items: ``submit`` raises ``QueueFull`` at once rather than grow.
- Deadlines: a request whose deadline passes while queued is dropped before compute and its
  caller gets ``DeadlineExpired``; a cancelled caller's items are dropped too.
- One request's items may land in several batches; results come back in the request's order.
"""

from __future__ import annotations

import asyncio
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
    """Hooks for metrics; the batcher calls them on the event loop."""

    def batch_computed(self, size: int, compute_s: float) -> None: ...

    def queue_depth(self, depth: int) -> None: ...


class _NullObserver:
    def batch_computed(self, size: int, compute_s: float) -> None:
        pass

    def queue_depth(self, depth: int) -> None:
        pass


class _Request:
    __slots__ = ("batch_size", "compute_s", "deadline", "enqueued", "future", "remaining",
                 "results")

    def __init__(self, future: asyncio.Future[Any], n: int, deadline: float | None) -> None:
        self.future = future
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.deadline = deadline
        self.enqueued = time.monotonic()
        self.compute_s = 0.0
        self.batch_size = 0


@dataclass(slots=True, eq=False)  # identity, not field, equality: items may be arrays
class _Slot:
    req: _Request
    index: int  # position in the request
    item: Any
    size: int
    seq: int  # arrival order across requests


class DynamicBatcher(Generic[T, R]):
    """Batches items from concurrent ``submit`` calls into ``compute`` calls; see module doc."""

    def __init__(
        self,
        compute: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        max_queue_size: int,
        size_of: Callable[[T], int] = lambda _: 1,
        workers: int = 1,
        split_cost: float = 32.0,
        observer: BatchObserver | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1 or max_queue_size < 1 or workers < 1 or max_queue_delay_s < 0:
            raise ValueError("batch size, queue size and workers must be >= 1; delay >= 0")
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self._compute = compute
        self._size_of = size_of
        self._split_cost = split_cost
        self._observer: BatchObserver = observer or _NullObserver()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-compute")
        self._free_workers = asyncio.Semaphore(workers)
        self._pending: list[_Slot] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._closed = False
        self._item_s = 0.0  # EWMA of compute seconds per item, for Retry-After estimates

    @property
    def depth(self) -> int:
        """Items waiting (not yet in a batch)."""
        return len(self._pending)

    def start(self) -> None:
        """Starts the batching loop; call from inside the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        # A bug, not a load condition: refuse new work (503) rather than let it wait forever.
        log.error("batching loop crashed", exc_info=task.exception())
        self._closed = True
        for slot in self._pending:
            _fail(slot.req, BatcherClosed("batching loop crashed"))
        self._pending.clear()

    async def close(self) -> None:
        """Fails what is still queued with ``BatcherClosed``, waits for running batches."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for slot in self._pending:
            _fail(slot.req, BatcherClosed("shutting down"))
        self._pending.clear()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        self._executor.shutdown(wait=False)

    def estimated_wait_s(self, extra_items: int = 0) -> float:
        """Rough time to drain the queue (plus ``extra_items``), from recent compute speed."""
        return (self.depth + extra_items) * self._item_s + self.max_queue_delay_s

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
        future: asyncio.Future[BatchOutcome[R]] = asyncio.get_running_loop().create_future()
        req = _Request(future, n, None if timeout_s is None else time.monotonic() + timeout_s)
        for index, item in enumerate(items):
            self._pending.append(_Slot(req, index, item, self._size_of(item), next(self._seq)))
        self._observer.queue_depth(len(self._pending))
        self._wake.set()
        try:
            if timeout_s is None:
                return await future
            async with asyncio.timeout(timeout_s) as scope:
                return await future
        except TimeoutError:
            self._abandon(req)
            if timeout_s is not None and scope.expired():
                raise DeadlineExpired(f"deadline of {timeout_s * 1000:.0f} ms passed") from None
            raise
        except asyncio.CancelledError:
            self._abandon(req)
            raise

    def _abandon(self, req: _Request) -> None:
        if any(slot.req is req for slot in self._pending):
            self._pending = [slot for slot in self._pending if slot.req is not req]
            self._observer.queue_depth(len(self._pending))

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._gather()
            await self._free_workers.acquire()
            batch = self._take()
            if not batch:
                self._free_workers.release()
                continue
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _gather(self) -> None:
        """Waits until a full batch is pending or the oldest item has waited the max delay."""
        while self._pending and len(self._pending) < self.max_batch_size:
            wait = self._pending[0].req.enqueued + self.max_queue_delay_s - time.monotonic()
            if wait <= 0:
                return
            self._wake.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                return

    def _take(self) -> list[_Slot]:
        """Drops expired requests, then picks the next batch (sorted by size)."""
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
        self._observer.queue_depth(len(self._pending))
        return batch

    async def _execute(self, batch: list[_Slot]) -> None:
        try:
            bounds = plan_groups([slot.size for slot in batch], self._split_cost)
            groups = [batch[lo:hi] for lo, hi in bounds]
            loop = asyncio.get_running_loop()
            try:
                outputs = await loop.run_in_executor(
                    self._executor, _compute_groups, self._compute,
                    [[slot.item for slot in group] for group in groups],
                )
            except Exception as exc:
                for slot in batch:
                    _fail(slot.req, exc)
                return
            for group, (results, compute_s) in zip(groups, outputs, strict=True):
                self._record(group, results, compute_s)
        finally:
            self._free_workers.release()

    def _record(self, group: list[_Slot], results: Sequence[R], compute_s: float) -> None:
        self._observer.batch_computed(len(group), compute_s)
        self._item_s = 0.8 * self._item_s + 0.2 * (compute_s / len(group))
        if len(results) != len(group):
            error = RuntimeError(f"compute returned {len(results)} results for {len(group)} items")
            for slot in group:
                _fail(slot.req, error)
            return
        charged: set[int] = set()
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
                queue_s = max(0.0, time.monotonic() - req.enqueued - req.compute_s)
                req.future.set_result(
                    BatchOutcome(req.results, queue_s, req.compute_s, req.batch_size)
                )


def _fail(req: _Request, exc: BaseException) -> None:
    if not req.future.done():
        req.future.set_exception(exc)


def _compute_groups(
    compute: Callable[[list[T]], Sequence[R]], groups: list[list[T]]
) -> list[tuple[Sequence[R], float]]:
    """Runs in the worker thread: one ``compute`` call per group, each timed."""
    out: list[tuple[Sequence[R], float]] = []
    for items in groups:
        started = time.perf_counter()
        results = compute(items)
        out.append((results, time.perf_counter() - started))
    return out
