"""A circuit breaker for one dependency (here: Redis), in the Envoy sense of the word.

closed ──N consecutive failures──▶ open ──open_s elapsed──▶ half-open (one probe let through)
  ▲                                  ▲                             │
  └──────────── probe succeeds ──────┼──────── probe fails ────────┘

While open every call is refused at once, so a dead or slow Redis costs the request path nothing.
Time comes from ``time.monotonic`` (injectable for tests). Single event loop: no locking.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Counts consecutive failures and refuses calls while open (see the module docstring).

    Callers ask ``allow()`` first; when it returns True they must report exactly one of
    ``success()``, ``failure()`` or ``release()`` (the call was abandoned, e.g. cancelled).
    ``on_change(open)`` is called when the breaker opens or closes.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        open_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self._clock = clock
        self._on_change = on_change
        self.state = BreakerState.CLOSED
        self.failures = 0
        self._opened_at = 0.0
        self._probing = False

    @property
    def is_open(self) -> bool:
        """True unless closed (half-open still refuses everything but the probe)."""
        return self.state is not BreakerState.CLOSED

    def allow(self) -> bool:
        """May a call go ahead now? Lets one probe through once ``open_s`` has passed."""
        if self.state is BreakerState.CLOSED:
            return True
        if self._probing:
            return False
        if self._clock() - self._opened_at >= self.open_s:
            self.state = BreakerState.HALF_OPEN
            self._probing = True
            return True
        return False

    def success(self) -> None:
        self.failures = 0
        self._probing = False
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
            if self._on_change is not None:
                self._on_change(False)

    def failure(self) -> None:
        self.failures += 1
        was_open = self.state is not BreakerState.CLOSED
        if was_open or self.failures >= self.failure_threshold:
            # A failed probe (or a late failure while open) restarts the open period.
            self.state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._probing = False
            if not was_open and self._on_change is not None:
                self._on_change(True)

    def release(self) -> None:
        """The allowed call ended without an outcome: let the next caller probe instead."""
        if self.state is BreakerState.HALF_OPEN and self._probing:
            self._probing = False
            self.state = BreakerState.OPEN  # _opened_at unchanged: the next allow() probes
