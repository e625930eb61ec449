"""What each fairness key was served lately: the express lane's measure of a quiet key.

The lane (``batcher.py``) computes a key's request beside a regular batch in compute instead of
after it. That is fair only for a key that is behind: a quiet tenant beside a flood. With two
tenants equally busy, the key not in compute would otherwise always take the lane, computing at
the loop's priority while the other's batches yield to it, and the other waits ten times as
long (measured: p50 8 against 154 ms). So a key takes the lane only while it was served
strictly less, in the last one to two windows, than every key of the regular batches in
compute. Counts are kept for the keys served in those windows only: memory follows the
traffic of the last two seconds, not the number of keys ever seen.
"""

from __future__ import annotations

from collections.abc import Callable


class RecentService:
    """Units (texts or tokens) served per key in the current window and the one before."""

    def __init__(self, clock: Callable[[], float], window_s: float = 1.0) -> None:
        self._clock = clock
        self._window_s = window_s
        self._start = clock()
        self._current: dict[str, float] = {}
        self._previous: dict[str, float] = {}

    def _roll(self) -> None:
        now = self._clock()
        elapsed = now - self._start
        if elapsed < self._window_s:
            return
        # One window on: the current becomes the previous; two or more: both are stale.
        self._previous = self._current if elapsed < 2 * self._window_s else {}
        self._current = {}
        self._start = now - elapsed % self._window_s

    def add(self, key: str, units: float) -> None:
        self._roll()
        self._current[key] = self._current.get(key, 0.0) + units

    def of(self, key: str) -> float:
        self._roll()
        return self._current.get(key, 0.0) + self._previous.get(key, 0.0)

    def not_behind(self, keys: frozenset[str]) -> frozenset[str]:
        """The keys served at least as much as the least served of ``keys`` (``keys``
        included): those the lane leaves to the regular workers."""
        if not keys:
            return keys
        self._roll()
        served = dict(self._previous)
        for key, units in self._current.items():
            served[key] = served.get(key, 0.0) + units
        floor = min(served.get(key, 0.0) for key in keys)
        return keys | frozenset(key for key, units in served.items() if units >= floor)
