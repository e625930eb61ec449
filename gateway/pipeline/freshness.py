"""Which cached entries may answer, and how: pure functions over entries and the time.

``from_cache`` turns looked-up entries into HIT / STALE outcomes (and says which keys need a
background refresh); ``stale_if_error`` fills what a failed backend call left empty from entries
inside their stale-if-error window. Both judge an entry by the stricter of its own windows and
those of the rule deciding the request now, so a policy that shortens a TTL reaches entries
stored under the old one. No I/O, no clock of their own: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.errors import DeadlineExceeded, GatewayError, Overloaded
from gateway.pipeline.call import BYPASS, COALESCED, HIT, MISS, STALE, Outcome
from gateway.policy import Rule


def overall_status(statuses: Sequence[str]) -> str:
    """One X-Cache value for the request: BYPASS when the cache was kept out of every item,
    else the least cached of its items, an item kept out (BYPASS) counting as the MISS it was
    (it reached a backend)."""
    present = set(statuses)
    if present == {BYPASS}:
        return BYPASS
    if BYPASS in present:
        present.add(MISS)
    for status in (MISS, STALE, COALESCED):
        if status in present:
            return status
    return HIT


def from_cache(entries: Sequence[Entry | None], keys: Sequence[CacheKey],
               outcomes: list[Outcome | None], now: float,
               max_age: float | None, rule: Rule) -> tuple[dict[CacheKey, int], float]:
    """Fill ``outcomes`` from fresh (HIT) and stale-while-revalidate (STALE) entries younger
    than ``max_age``, fresh or stale by the stricter of the entry's and ``rule``'s windows.
    Returns the stale keys (-> an item position, for the refresh) and the backend compute time
    the answers saved, in milliseconds."""
    stale: dict[CacheKey, int] = {}
    saved_ms = 0.0
    ttl, swr = rule.ttl_s, rule.stale_while_revalidate_s
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        age = entry.age(now)
        if max_age is not None and age > max_age:
            continue
        if entry.is_fresh(now, ttl):
            outcomes[i] = Outcome(entry.value, entry.meta, HIT, age, keys[i], entry)
        elif entry.within_swr(now, ttl, swr):
            outcomes[i] = Outcome(entry.value, entry.meta, STALE, age, keys[i], entry)
            stale.setdefault(keys[i], i)
        else:
            continue
        saved_ms += entry.compute_ms
    return stale, saved_ms


def stale_if_error(entries: Sequence[Entry | None], keys: Sequence[CacheKey],
                   outcomes: list[Outcome | None], now: float, failure: GatewayError,
                   rule: Rule) -> bool:
    """Fill the items a backend failure left empty from entries inside stale-if-error (the
    stricter of the entry's and ``rule``'s), when the failure is one stale-if-error covers
    (5xx, shed, deadline). True when every item is filled."""
    if isinstance(failure, DeadlineExceeded | Overloaded) or failure.status >= 500:
        ttl, sie = rule.ttl_s, rule.stale_if_error_s
        for i, entry in enumerate(entries):
            if outcomes[i] is None and entry is not None and entry.within_sie(now, ttl, sie):
                outcomes[i] = Outcome(entry.value, entry.meta, STALE, entry.age(now), keys[i],
                                      entry)
    return all(o is not None for o in outcomes)
