"""The priority gate: batch lines use only backend capacity interactive calls leave unused.

Before each try of a line the worker asks the gate. A line may go only while, in the tier the
router would send it to (the nearest one with a backend available):

- no interactive request waits in the tier's admission queue (a waiting request means the tier
  is full: batch work would take the next slot from it), and
- the calls in flight there are under ``batch.share`` of the tier's concurrency limit (so a
  burst of interactive calls finds free slots at once), and
- this process has fewer than ``batch.concurrency`` lines in flight.

Otherwise the line waits and asks again, backing off from 5 ms to 250 ms while it is refused:
a batch slows down under interactive load, it never competes with it. Batch calls still go
through admission like any other call (the gate adds to it, it does not bypass it).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from gateway.admission import Admission
from gateway.observe import Observer
from gateway.routing.balancer import Router

_FIRST_WAIT_S = 0.005
_LONGEST_WAIT_S = 0.25


class Gate:
    """Lets batch lines through while the interactive path leaves room (module docstring)."""

    def __init__(self, admission: Admission, router: Router, *, share: float, concurrency: int,
                 observer: Observer) -> None:
        self._admission = admission
        self._router = router
        self._share = share
        self._concurrency = concurrency
        self._observer = observer
        self.inflight = 0
        """Lines of this process between ``enter`` and ``leave``."""

    def refusal(self) -> str | None:
        """Why a line may not go now (``no_backend``, ``queued``, ``busy``, ``own_limit``), or
        None when it may."""
        if self.inflight >= self._concurrency:
            return "own_limit"
        state = self._router.pick()
        if state is None:
            return "no_backend"
        tier = self._router.tier_of(state)
        a = self._admission
        if a.queue_depth(tier) > 0:
            return "queued"
        if a.inflight(tier) >= max(1, int(self._share * a.limit(tier))):
            return "busy"
        return None

    async def enter(self) -> None:
        """Wait until a line may go, then count it in flight (``leave`` when done)."""
        wait = _FIRST_WAIT_S
        while (reason := self.refusal()) is not None:
            self._observer.batch_deferred(reason)
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT_S)
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1

    async def __aenter__(self) -> Gate:
        await self.enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.leave()
