"""Hedging policy: when a call has taken longer than its tier's p95, a second copy may go out.

The p95 comes from a sliding window of successful call latencies per tier, recomputed every few
samples rather than per call. Hedging starts only after ``hedge_min_samples`` samples, so a cold
tier never doubles its load on a guess. ``race`` runs a call and its hedged copy; which
backend takes the copy, and whether a free slot exists for it, is the caller's business.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gateway.routing.config import RoutingSettings

T = TypeVar("T")

_WINDOW = 256  # latencies kept per tier
_REFRESH = 16  # new samples before the p95 is recomputed


class HedgePolicy:
    """Per-tier p95 of recent latencies, as the delay before a hedged copy."""

    def __init__(self, settings: RoutingSettings) -> None:
        self._min_samples = settings.hedge_min_samples
        self._samples: dict[str, collections.deque[float]] = {}
        self._p95: dict[str, float] = {}
        self._fresh: dict[str, int] = {}

    def observe(self, tier: str, latency_s: float) -> None:
        """Record one successful call's latency."""
        window = self._samples.get(tier)
        if window is None:
            window = self._samples[tier] = collections.deque(maxlen=_WINDOW)
        window.append(latency_s)
        self._fresh[tier] = self._fresh.get(tier, 0) + 1

    def delay(self, tier: str) -> float | None:
        """Seconds to wait before hedging a call in ``tier``; None while samples are too few."""
        window = self._samples.get(tier)
        if window is None or len(window) < self._min_samples:
            return None
        if tier not in self._p95 or self._fresh.get(tier, 0) >= _REFRESH:
            ordered = sorted(window)
            self._p95[tier] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            self._fresh[tier] = 0
        return self._p95[tier]


async def race(
    primary: Coroutine[Any, Any, T],
    delay: float,
    spawn_hedge: Callable[[], Coroutine[Any, Any, T] | None],
) -> T:
    """Run ``primary``; if it is still running after ``delay``, start ``spawn_hedge()`` (when it
    offers a copy) and return the first success, cancelling the other. When every copy fails,
    the primary's error is raised. Cancelling the race cancels both.
    """
    first = asyncio.create_task(primary)
    tasks: set[asyncio.Task[T]] = {first}
    try:
        done, _ = await asyncio.wait(tasks, timeout=delay)
        if not done:
            copy = spawn_hedge()
            if copy is not None:
                tasks.add(asyncio.create_task(copy))
        error: BaseException | None = None
        while tasks:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if exc is None:
                    return task.result()
                if error is None or task is first:
                    error = exc
        assert error is not None
        raise error
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
