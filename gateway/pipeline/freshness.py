"""Which cached entries may answer, and how: pure functions over entries and the time.

``from_cache`` turns looked-up entries into HIT / STALE outcomes (and says which keys need a
background refresh); ``stale_if_error`` fills what a failed backend call left empty from entries
inside their stale-if-error window. No I/O, no clock of their own: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.errors import DeadlineExceeded, GatewayError, Overloaded
from gateway.pipeline.call import BYPASS, COALESCED, HIT, MISS, STALE, Outcome


def overall_status(statuses: Sequence[str]) -> str:
    """One X-Cache value for the request: the least cached of its items wins."""
    present = set(statuses)
    for status in (BYPASS, MISS, STALE, COALESCED):
        if status in present:
            return status
    return HIT


def from_cache(entries: Sequence[Entry | None], keys: Sequence[CacheKey],
               outcomes: list[Outcome | None], now: float,
               max_age: float | None) -> tuple[dict[CacheKey, int], float]:
    """Fill ``outcomes`` from fresh (HIT) and stale-while-revalidate (STALE) entries younger
    than ``max_age``. Returns the stale keys (-> an item position, for the refresh) and the
    backend compute time the answers saved, in milliseconds."""
    stale: dict[CacheKey, int] = {}
    saved_ms = 0.0
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        age = entry.age(now)
        if max_age is not None and age > max_age:
            continue
        if entry.is_fresh(now):
            outcomes[i] = Outcome(entry.value, entry.meta, HIT, age, keys[i], entry)
        elif entry.within_swr(now):
            outcomes[i] = Outcome(entry.value, entry.meta, STALE, age, keys[i], entry)
            stale.setdefault(keys[i], i)
        else:
            continue
        saved_ms += entry.compute_ms
    return stale, saved_ms


def stale_if_error(entries: Sequence[Entry | None], keys: Sequence[CacheKey],
                   outcomes: list[Outcome | None], now: float, failure: GatewayError) -> bool:
    """Fill the items a backend failure left empty from entries inside stale-if-error, when the
    failure is one stale-if-error covers (5xx, shed, deadline). True when every item is filled."""
    if isinstance(failure, DeadlineExceeded | Overloaded) or failure.status >= 500:
        for i, entry in enumerate(entries):
            if outcomes[i] is None and entry is not None and entry.within_sie(now):
                outcomes[i] = Outcome(entry.value, entry.meta, STALE, entry.age(now), keys[i],
                                      entry)
    return all(o is not None for o in outcomes)
