"""The priority gate: batch lines use only backend capacity interactive calls leave unused.

Before each try of a line the worker asks the gate. A line may go only while, in the tier the
router would send it to (the nearest one with a backend available):

- no interactive request waits in the tier's admission queue (a waiting request means the tier
  is full: batch work would take the next slot from it), and
- the calls in flight there are under ``batch.share`` of the tier's concurrency limit (so a
  burst of interactive calls finds free slots at once), and
- this process has fewer than ``batch.concurrency`` lines in flight (a semaphore: the lines
  beyond it wait without polling), and
- the tier's calls are not slowing down: its slot-hold time (admission's EWMA) is under 1.25x
  its recent floor (the lowest it has been, drifting up 1% a second). With a concurrency limit
  far above what the backends run at once (``tier_concurrency`` 64 by default), batch calls
  would otherwise queue inside the backends, ahead of interactive ones; a tier with nothing in
  flight always takes a line (nothing to protect, and its answer refreshes the EWMA), and
- this process's event loop keeps time (``LoopLag``: a 5 ms ticker's overshoot, averaged, under
  10 ms): a gateway whose own CPU is saturated answers interactive calls late whatever the
  backends have free, so batch lines yield the CPU too.

Otherwise the line waits and asks again, every 1 ms at first, backing off to 20 ms while it is
refused (short, so a slot interactive calls leave free is used soon): a batch slows down under
interactive load, it never competes with it. Batch calls still go
through admission like any other call (the gate adds to it, it does not bypass it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

from gateway.routing.balancer import Router
from gateway.telemetry.observer import Observer
from gateway.upstream.admission.control import Admission

_FIRST_WAIT_S = 0.001
_LONGEST_WAIT_S = 0.02
_TICK_S = 0.005
_LAG_LIMIT_S = 0.010
_LAG_ALPHA = 0.2
_SLOW_FACTOR = 1.25
_FLOOR_DRIFT_PER_S = 0.01


class LoopLag:
    """How late this process's event loop runs a 5 ms timer, as an EWMA (seconds): near zero
    while the loop has CPU to spare, growing as soon as work queues behind it."""

    def __init__(self) -> None:
        self.value = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _tick(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(_TICK_S)
            late = max(0.0, time.perf_counter() - start - _TICK_S)
            self.value += _LAG_ALPHA * (late - self.value)


class Gate:
    """Lets batch lines through while the interactive path leaves room (module docstring)."""

    def __init__(self, admission: Admission, router: Router, *, share: float, concurrency: int,
                 observer: Observer, lag: LoopLag | None = None) -> None:
        self._admission = admission
        self._router = router
        self._share = share
        self._observer = observer
        self._own = asyncio.Semaphore(concurrency)
        self._lag = lag
        self._floors: dict[str, tuple[float, float]] = {}  # tier -> (floor s, when updated)
        self.inflight = 0
        """Lines of this process between ``enter`` and ``leave``."""

    def refusal(self) -> str | None:
        """Why a line may not go now (``loop_busy``, ``no_backend``, ``queued``, ``busy``,
        ``slow``), or None when it may (this process's own limit aside)."""
        if self._lag is not None and self._lag.value > _LAG_LIMIT_S:
            return "loop_busy"
        state = self._router.pick()
        if state is None:
            return "no_backend"
        tier = self._router.tier_of(state)
        a = self._admission
        if a.queue_depth(tier) > 0:
            return "queued"
        if a.inflight(tier) >= max(1, int(self._share * a.limit(tier))):
            return "busy"
        if self._slowing(tier):
            return "slow"
        return None

    def _slowing(self, tier: str) -> bool:
        """The tier's slot-hold EWMA is over ``_SLOW_FACTOR`` x its floor (module docstring)."""
        a = self._admission
        ewma = a.service_time_s(tier)
        if ewma <= 0.0:
            return False
        now = time.monotonic()
        before = self._floors.get(tier)
        floor = ewma if before is None else min(
            ewma, before[0] * (1.0 + _FLOOR_DRIFT_PER_S * (now - before[1])))
        self._floors[tier] = (floor, now)
        return a.inflight(tier) > 0 and ewma > floor * _SLOW_FACTOR

    async def enter(self) -> None:
        """Wait until a line may go, then count it in flight (``leave`` when done)."""
        await self._own.acquire()
        try:
            wait = _FIRST_WAIT_S
            while (reason := self.refusal()) is not None:
                self._observer.batch_deferred(reason)
                await asyncio.sleep(wait)
                wait = min(wait * 2, _LONGEST_WAIT_S)
        except BaseException:
            self._own.release()
            raise
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1
        self._own.release()

    async def __aenter__(self) -> Gate:
        await self.enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.leave()
