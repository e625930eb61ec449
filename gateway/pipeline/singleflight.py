"""Singleflight: identical misses in flight share one upstream call.

The first caller to ``claim`` a key is its leader and must settle it (``resolve`` or
``reject``); later callers get the same future and wait on it (through ``join``, which shields
the shared future so one follower's cancellation never cancels it for the others). A flight is
forgotten the moment it settles, so the next miss of that key starts a new one and nothing
accumulates.

If the leader is cancelled or fails, followers get the error (``FlightAbandoned`` for a
cancellation: never ``CancelledError``, which would read as their own cancellation) and may
retry, becoming leaders themselves. Rejected futures have their exception marked retrieved, so a
flight nobody joined does not log "Future exception was never retrieved".
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class FlightAbandoned(Exception):
    """The leader of a flight went away (cancelled) before producing a value; retry."""


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class SingleFlight(Generic[K, V]):
    """Per-key in-flight deduplication on one event loop (see the module docstring)."""

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    def claim(self, key: K) -> tuple[asyncio.Future[V], bool]:
        """``(future, is_leader)``: the first claimer leads and must settle the key."""
        fut = self._flights.get(key)
        if fut is not None:
            return fut, False
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        self._flights[key] = fut
        return fut, True

    def resolve(self, key: K, value: V) -> None:
        """Hand ``value`` to every follower of ``key``. Followers share it: do not mutate it."""
        fut = self._flights.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def reject(self, key: K, exc: BaseException) -> None:
        """Fail every follower of ``key`` with ``exc`` (a cancellation becomes FlightAbandoned)."""
        fut = self._flights.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_exception(_shareable(exc))

    @staticmethod
    async def join(fut: asyncio.Future[V]) -> V:
        """Wait for a flight as a follower; cancelling this waiter leaves the flight running."""
        return await asyncio.shield(fut)


def _shareable(exc: BaseException) -> BaseException:
    # CancelledError (or KeyboardInterrupt...) in a follower would look like its own
    # cancellation; followers should see an ordinary, retryable error instead.
    if isinstance(exc, Exception):
        return exc
    abandoned = FlightAbandoned("the leading request was cancelled")
    abandoned.__cause__ = exc
    return abandoned
