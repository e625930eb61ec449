"""Singleflight: identical misses in flight share one upstream call.

The first caller to ``claim`` a key is its leader and must settle it (``resolve`` or
``reject``); later callers get the same future and wait on it (through ``join``, which shields
the shared future so one follower's cancellation never cancels it for the others). A flight is
forgotten the moment it settles, so the next miss of that key starts a new one and nothing
accumulates.

A flight has a rank: the backend priority of the call that leads it (Triton's numbering, 1
highest; ``gateway/upstream/schedule.py``). A caller joins a flight of the same rank or a
better one; a caller with a better rank than the flight's (an interactive request after a
Batch API line of the same text) leads a flight of its own instead, so it never waits at the
line's priority. The newer flight takes the key; the older one still settles its own
followers (``resolve`` and ``reject`` name the leader's future).

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
        self._flights: dict[K, tuple[asyncio.Future[V], int]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    def claim(self, key: K, rank: int = 0) -> tuple[asyncio.Future[V], bool]:
        """``(future, is_leader)``: a caller of ``rank`` (a backend priority, lower is better)
        joins the key's flight if its rank is ``rank`` or better, else leads (and must settle
        the future with ``resolve`` or ``reject``)."""
        found = self._flights.get(key)
        if found is not None and found[1] <= rank:
            return found[0], False
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        self._flights[key] = (fut, rank)
        return fut, True

    def _settled(self, key: K, fut: asyncio.Future[V]) -> bool:
        """Forget ``key`` if ``fut`` is its flight (a better-ranked flight may have taken the
        key since); True if ``fut`` still needs a value."""
        found = self._flights.get(key)
        if found is not None and found[0] is fut:
            del self._flights[key]
        return not fut.done()

    def resolve(self, key: K, fut: asyncio.Future[V], value: V) -> None:
        """Hand ``value`` to every follower of the flight ``fut`` (its leader's, from
        ``claim``). Followers share it: do not mutate it."""
        if self._settled(key, fut):
            fut.set_result(value)

    def reject(self, key: K, fut: asyncio.Future[V], exc: BaseException) -> None:
        """Fail every follower of the flight ``fut`` with ``exc`` (a cancellation becomes
        FlightAbandoned)."""
        if self._settled(key, fut):
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
