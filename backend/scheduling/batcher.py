"""Dynamic batching over the scheduled queue: requests in, batches to worker threads, results
back in each request's order.

Callers ``await batcher.submit(items, priority=, key=, timeout_s=)``; model code only ever sees
``compute(list_of_items) -> results``, run in a worker thread, off the event loop. What each
batch holds is the queue's choice (``queue.py``: priority, then fairness, then deadlines and the
compute bound); the batcher decides when a batch goes:

- A request that finds a worker idle and nothing waiting is computed at once, alone if alone
  (one text: handed to the worker directly, without a trip through the queue, which would
  give back that same batch of one).
- When a worker frees up and fewer items wait than a full batch, the oldest may wait up to
  ``max_queue_delay`` for company (by then it has usually waited that long already while the
  worker was busy, so it goes at once); a full batch goes at once.
- Refused at once, never queued: a level whose queue is full (``QueueFull``), and a request
  whose fair share of the work ahead, at the learned cost, outlasts its deadline
  (``WouldMissDeadline``). Dropped before compute and answered at once: a request whose deadline
  passes while queued (a timer per request), or which could not finish even alone when its turn
  comes (``DeadlineExpired``); a cancelled caller's items.

Hand-offs, per batch: one ``executor.submit`` to a worker thread and one
``call_soon_threadsafe`` back, which resolves the callers' futures and dispatches the next
batch in the same callback: a lone request costs one thread hand-off each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from backend.scheduling.cost import CostModel
from backend.scheduling.delivery import BatchOutcome, Outputs, compute_groups, deliver, fail
from backend.scheduling.errors import BatcherClosed, DeadlineExpired, QueueFull, WouldMissDeadline
from backend.scheduling.grouping import plan_groups
from backend.scheduling.observer import BatchObserver, NullObserver
from backend.scheduling.policy import SchedulePolicy
from backend.scheduling.queue import ScheduleQueue, Slot, Ticket
from backend.scheduling.served import RecentService

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("backend.scheduling")


class DynamicBatcher(Generic[T, R]):
    """Batches items from concurrent ``submit`` calls into ``compute`` calls; see module doc."""

    def __init__(
        self,
        compute: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int,
        max_queue_size: int = 1024,
        policy: SchedulePolicy | None = None,
        size_of: Callable[[T], int] = lambda _: 1,
        workers: int = 1,
        split_cost: float = 32.0,
        max_call_size: int | None = None,
        observer: BatchObserver | None = None,
        name: str = "batcher",
        clock: Callable[[], float] = time.monotonic,
        cost: CostModel | None = None,
        express: bool = False,
        nice: int = 0,
        nice_hold_s: float = 1.0,
    ) -> None:
        if max_batch_size < 1 or workers < 1:
            raise ValueError("batch size and workers must be >= 1")
        self.policy = policy or SchedulePolicy.uniform(
            max_queue_size=max_queue_size, default_timeout_s=30.0)
        self.max_batch_size = max_batch_size
        self.workers = workers
        self.cost = cost or CostModel()
        self._queue = ScheduleQueue(self.policy)
        self._compute = compute
        self._size_of = size_of
        self._split_cost = split_cost
        self._max_call_size = max_call_size
        self._observer: BatchObserver = observer or NullObserver()
        self._clock = clock
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-compute",
                                            initializer=_lower_priority, initargs=(nice,))
        self._express_executor = (ThreadPoolExecutor(1, thread_name_prefix=f"{name}-express")
                                  if express else None)
        # With the lane, the nice steps hold only while it is in use (its last batch began
        # within ``nice_hold_s``): a regular batch then goes to a niced worker, otherwise to
        # one at the loop's priority, so a lone tenant's batches (overload, a burst) keep
        # their share of a core shared with the loops. A thread may not lower its own nice
        # value without privilege, hence two sets of threads rather than one reniced.
        self._plain_executor = (ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-plain")
                                if express and nice > 0 else None)
        self._nice_hold_s = nice_hold_s
        self._served = RecentService(clock) if express else None
        self._lane_at = -math.inf  # when the express lane's last batch began
        self._idle = workers  # regular workers idle
        # The express lane: one more worker, for what the regular ones' batches would make
        # wait (``_express_take``); ``_running`` holds each regular batch's best level and keys.
        self.express = express
        self._express_idle = express
        self._running: dict[int, tuple[int, frozenset[str]]] = {}
        self._ends: list[float] = []  # expected end of each running batch
        self._forming: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Future[None] | None = None
        self._closed = False
        self._seq = itertools.count()

    @property
    def depth(self) -> int:
        """Items waiting (not yet in a batch)."""
        return self._queue.depth

    def depth_of(self, level: int) -> int:
        """Items waiting at 0-based ``level``."""
        return self._queue.levels[level].items

    @property
    def busy_workers(self) -> int:
        """Workers computing a batch now (the express lane's included)."""
        return self.workers - self._idle + (self.express and not self._express_idle)

    def _all_idle(self) -> bool:
        return self._idle == self.workers and self._express_idle == self.express

    def start(self) -> None:
        """Binds the batcher to the running event loop; call from inside it before ``submit``."""
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        """Fails what is still queued with ``BatcherClosed``, waits for running batches."""
        self._closed = True
        if self._forming is not None:
            self._forming.cancel()
        for req in self._queue.drain():
            fail(req, BatcherClosed("shutting down"))
        if not self._all_idle():
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        self._executor.shutdown(wait=False)
        if self._express_executor is not None:
            self._express_executor.shutdown(wait=False)
        if self._plain_executor is not None:
            self._plain_executor.shutdown(wait=False)

    def estimated_wait_s(self) -> float:
        """Rough time to drain the queue, from the learned cost."""
        return self.cost.estimate(self._queue.tokens) / self.workers

    async def submit(self, items: Sequence[T], *, timeout_s: float | None = None,
                     priority: int = 0, key: str = "", express: bool = False
                     ) -> BatchOutcome[R]:
        """Queues ``items`` at ``priority`` (0: the default) for fairness key ``key`` and waits
        for their results, in order. ``timeout_s`` None: the level's default timeout.
        ``express``: the caller judged ``key`` quiet; only such a request may take the express
        lane at the level of the batch in compute (``_express_take``).

        Raises ``QueueFull`` (or ``WouldMissDeadline``) at once when refused,
        ``DeadlineExpired`` when the deadline passes first or cannot be met, ``BatcherClosed``
        on shutdown, and whatever ``compute`` raised for a batch that carried them.
        """
        if self._closed:
            raise BatcherClosed("shutting down")
        n = len(items)
        if not n:
            return BatchOutcome([], 0.0, 0.0, 0)
        loop = self._loop
        if loop is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        level = self.policy.level_of(priority)
        rules = self.policy.levels[level]
        waiting = self._queue.levels[level].items
        if waiting + n > rules.max_queue_size:
            self._observer.rejected(level, "queue_full")
            raise QueueFull(f"queue full: {waiting} of {rules.max_queue_size} items waiting "
                            f"at priority {level + 1}", self.estimated_wait_s())
        timeout = rules.default_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            self._observer.dropped(level, "expired")
            raise DeadlineExpired("deadline passed before queueing")
        now = self._clock()
        sizes = [self._size_of(item) for item in items]
        expected = self._expected_s(level, key, sum(sizes), now)
        if expected > timeout:
            self._observer.rejected(level, "deadline")
            raise WouldMissDeadline(
                f"expected wait and compute {expected * 1000:.0f} ms exceed the deadline of "
                f"{timeout * 1000:.0f} ms", expected)
        future: asyncio.Future[BatchOutcome[R]] = loop.create_future()
        req = Ticket(n, level=level, key=key, deadline=now + timeout, enqueued=now,
                     seq=next(self._seq), future=future, express=express)
        was_empty = self._queue.depth == 0
        if n == 1 and was_empty and self._idle:
            # The lone request (the common miss at low load): an idle worker takes it now,
            # without a trip through the queue. The queue would hand back exactly this batch
            # of one (nothing else waits; a key's fairness count is kept only while it has
            # something waiting). What ``take`` would check on the way, that its compute ends
            # before its deadline, is the arrival check above (``_expected_s``: idle and
            # nothing waiting, its own compute).
            size = sizes[0]
            self._launch(loop, [Slot(req, 0, items[0], size, req.seq)], [(0, 1)], [[items[0]]],
                         now + self.cost.estimate(size))
        else:
            size_iter = iter(sizes)
            self._queue.push(req, items, lambda _: next(size_iter))
            if self._idle and (was_empty or self._full()):
                self._dispatch(now_ok=True)  # an idle worker takes it now, not a turn later
            elif self._idle and self._forming is None:
                self._dispatch()
            elif self._express_idle:
                self._dispatch()  # the express lane, if this request may take it
        # One timer handle, not asyncio.timeout's task cancellation: it fails the future.
        timer = None if future.done() else loop.call_later(timeout, self._expire, req, timeout)
        try:
            return await future
        except asyncio.CancelledError:
            self._queue.remove(req)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expected_s(self, level: int, key: str, tokens: int, now: float) -> float:
        """Wait plus compute for a new request, at its fair share of the work ahead."""
        if not self.cost.learned:
            return 0.0
        if self._idle and not self._queue.depth:
            return self.cost.estimate(tokens)
        running = 0.0 if self._idle else max(0.0, min(self._ends, default=now) - now)
        ahead = self._queue.tokens_ahead(level, key, tokens)
        return running + self.cost.estimate(ahead) / self.workers

    def _full(self) -> bool:
        budget = self.policy.max_batch_compute_s
        return self._queue.depth >= self.max_batch_size or bool(
            budget and self.cost.estimate(self._queue.tokens) - self.cost.overhead_s >= budget)

    def _expire(self, req: Ticket, timeout_s: float) -> None:
        """The request's deadline passed before all its results came: answered now."""
        if not req.future.done():
            queued = req.queued > 0
            self._queue.remove(req)
            if queued:
                self._observer.dropped(req.level, "expired")
            req.future.set_exception(
                DeadlineExpired(f"deadline of {timeout_s * 1000:.0f} ms passed"))

    def _window_closed(self, now: float) -> bool:
        """Whether a non-full batch may go now (the forming window has passed)."""
        delay = self.policy.max_queue_delay_s
        oldest = self._queue.oldest_enqueued()
        if not delay or oldest is None or self._full() or now >= oldest + delay:
            return True
        loop = self._loop
        if self._forming is None and loop is not None:
            self._forming = loop.call_later(oldest + delay - now, self._window_ends)
        return False

    def _window_ends(self) -> None:
        self._forming = None
        self._dispatch(now_ok=True)

    def _dispatch(self, *, now_ok: bool = False) -> None:
        """Hands batches to idle workers while both exist (on the event loop); unless
        ``now_ok``, a batch that is not full waits for the forming window."""
        loop = self._loop
        while (loop is not None and (self._idle or self._express_idle) and self._queue.depth
               and not self._closed):
            now = self._clock()
            for req in self._queue.expired(now):
                self._observer.dropped(req.level, "expired")
                fail(req, DeadlineExpired("deadline passed while queued"))
            express = not self._idle
            if express:
                batch, late = self._express_take(now)
            elif not (now_ok or self._window_closed(now)):
                if self._express_idle and self._running:
                    # The regular workers' window is open; the lane still takes what their
                    # batch in compute would make wait.
                    batch, late = self._express_take(now)
                    express = True
                else:
                    return
            else:
                batch, late = self._queue.take(now, self.max_batch_size, self.cost)
            for req in late:
                self._observer.dropped(req.level, "late")
                fail(req, DeadlineExpired("its compute could not end before its deadline"))
            if not batch:
                if late:
                    continue
                return
            if self._forming is not None and not express:
                self._forming.cancel()
                self._forming = None
            batch.sort(key=lambda slot: (slot.size, slot.seq))
            sizes = [slot.size for slot in batch]
            bounds = plan_groups(sizes, self._split_cost, self._max_call_size)
            groups = [[slot.item for slot in batch[lo:hi]] for lo, hi in bounds]
            end = now + self.cost.estimate(sum(sizes), len(bounds))
            if not self._launch(loop, batch, bounds, groups, end, express=express):
                return

    def _express_take(self, now: float) -> tuple[list[Slot], list[Ticket]]:
        """The express lane's batch: items at a better level than every regular batch in
        compute, or at the best such level from a request its caller judged quiet
        (``express``: the gateway had no backlog of its tenant's calls) of a key none of them
        holds and that was served less lately than each key they hold (``RecentService``).
        Two tenants evenly busy both have backlogs in the gateway, so neither takes the lane
        in turns, computing its texts alone beside the other's batch. A quiet tenant's
        request beside a flood, or an interactive one beside batch lines, then computes
        beside the batch in compute instead of after it: on a shared core the kernel
        time-slices the two, which pre-empts the long batch as a queue can't."""
        if not self._running:
            return [], []
        level = min(lv for lv, _ in self._running.values())
        keys = frozenset().union(*(k for _, k in self._running.values()))
        if self._served is not None:
            keys = self._served.not_behind(keys)  # at its level, only a key that is behind
        return self._queue.take(now, self.max_batch_size, self.cost, below=level,
                                exclude=keys)

    def _launch(self, loop: asyncio.AbstractEventLoop, batch: list[Slot],
                bounds: list[tuple[int, int]], groups: list[list[T]], end: float,
                *, express: bool = False) -> bool:
        """Hands a batch to an idle worker (the express lane's with ``express``); False (its
        callers failed) when shut down."""
        if express:
            self._express_idle = False
            self._lane_at = self._clock()
            self._observer.express_batch(len(batch))
        else:
            self._idle -= 1
            self._running[id(batch)] = (min(slot.req.level for slot in batch),
                                        frozenset(slot.req.key for slot in batch))
        self._ends.append(end)
        served = self._served
        if served is not None:
            by_tokens = self._queue.by_tokens  # the queue's unit of fairness
            for slot in batch:
                served.add(slot.req.key, slot.size if by_tokens else 1)
        try:
            executor = self._executor_for(express)
            assert executor is not None
            executor.submit(self._work, loop, batch, bounds, groups, end, express)
        except RuntimeError as exc:  # the executor is shut down
            self._free(batch, express)
            self._ends.remove(end)
            for slot in batch:
                fail(slot.req, BatcherClosed(str(exc)))
            return False
        return True

    def _executor_for(self, express: bool) -> ThreadPoolExecutor | None:
        if express:
            return self._express_executor
        if (self._plain_executor is not None
                and self._clock() - self._lane_at > self._nice_hold_s):
            return self._plain_executor  # the lane is not in use: no reason to yield
        return self._executor

    def _free(self, batch: list[Slot], express: bool) -> None:
        if express:
            self._express_idle = True
        else:
            self._idle += 1
            del self._running[id(batch)]

    def _work(self, loop: asyncio.AbstractEventLoop, batch: list[Slot],
              bounds: list[tuple[int, int]], groups: list[list[T]], end: float,
              express: bool) -> None:
        """In a worker thread: computes every group, then hands the outcome to the loop."""
        outputs: Outputs | None = None
        error: BaseException | None = None
        try:
            outputs = compute_groups(self._compute, groups)
        except Exception as exc:  # the callers get it
            error = exc
        except BaseException as exc:  # never strand the callers, whatever was raised
            error = RuntimeError(f"compute raised {type(exc).__name__}")
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
            loop.call_soon_threadsafe(self._finished, batch, bounds, outputs, error, end,
                                      express)

    def _finished(self, batch: list[Slot], bounds: list[tuple[int, int]],
                  outputs: Outputs | None, error: BaseException | None, end: float,
                  express: bool = False) -> None:
        """On the loop: delivers a batch's results, frees its worker, dispatches the next."""
        self._free(batch, express)
        self._ends.remove(end)
        try:
            if outputs is None:
                for slot in batch:
                    fail(slot.req, error or RuntimeError("compute gave no result"))
            else:
                for (lo, hi), (results, compute_s) in zip(bounds, outputs, strict=True):
                    self._record(batch[lo:hi], results, compute_s)
        except Exception as exc:  # a bug here must not strand the batch's callers
            log.error("delivering a batch failed", exc_info=exc)
            for slot in batch:
                fail(slot.req, exc)
        if self._drained is not None and self._all_idle():
            if not self._drained.done():
                self._drained.set_result(None)
            return
        self._dispatch()

    def _record(self, group: list[Slot], results: Sequence[object], compute_s: float) -> None:
        self._observer.batch_computed(len(group), compute_s)
        self.cost.observe(sum(slot.size for slot in group), compute_s)
        deliver(group, results, compute_s, self._clock(), self._observer)


def _lower_priority(nice: int) -> None:
    """A regular worker thread's start: ``nice`` steps below the event loop's priority (Linux
    sets it per thread), so the loops and the express lane run first on a shared core."""
    if nice > 0:
        with contextlib.suppress(OSError, AttributeError):
            tid = threading.get_native_id()  # a new thread starts at its creator's nice
            os.setpriority(os.PRIO_PROCESS, tid,
                           min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
