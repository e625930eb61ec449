"""L1: the in-process LRU, bounded by entry count and by bytes, with per-entry expiry.

An ``OrderedDict`` kept in recency order (``move_to_end`` on a hit, ``popitem(last=False)`` to
evict). With ``admission`` on (TinyLFU, ``sketch.py``), every lookup is counted in a frequency
sketch and a new key enters a full cache only if it was asked for more often lately than the
entry it would evict: a scan of one-off texts then passes by instead of flushing the entries
everybody repeats (``bench/hitratio.py`` measures by how much). Expired entries are dropped
lazily: when looked up past their ``expires_at``, or when they reach the LRU end under pressure.
Everything runs on the event loop thread, so the sync ``get``/``set`` are safe and let the
pipeline's hit path skip an ``await``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, scope_tag
from gateway.cache.settings import CacheSettings
from gateway.cache.sketch import FrequencySketch

#: Rough per-entry cost beyond the value and meta bytes (key, Entry object, dict node), so that
#: many tiny entries still count against ``max_bytes``.
ENTRY_OVERHEAD = 240
#: Least recently used entries a newcomer is weighed against (the least asked of them would go).
VICTIMS = 8
#: What an entry weighs, about (one 384-d float32 answer and the overhead): sizes the sketch.
TYPICAL_ENTRY = 2048


def entry_size(entry: Entry) -> int:
    """Bytes an entry is charged against ``max_bytes``."""
    return len(entry.value) + len(entry.meta) + ENTRY_OVERHEAD


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """A snapshot of L1's counters and size."""

    hits: int
    misses: int
    evictions: int
    expirations: int
    entries: int
    bytes: int
    rejections: int = 0  # new keys the admission filter kept out


class MemoryCache:
    """Bounded in-process LRU tier with TTL (see the module docstring)."""

    name = "l1"

    def __init__(
        self, max_entries: int, max_bytes: int, clock: Callable[[], float] = time.time,
        *, admission: bool = False,
    ) -> None:
        # Bounds are CacheSettings' to check (settings section ``cache``).
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self._data: OrderedDict[CacheKey, Entry] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.expirations = 0
        self.rejections = 0
        # Sized for the entries the cache can hold: a byte bound may allow far fewer.
        held = min(max_entries, max(64, max_bytes // TYPICAL_ENTRY))
        self._sketch = FrequencySketch(held) if admission else None
        self._pending: list[CacheKey] | None = [] if admission else None
        self._batch = self._sketch.batch if self._sketch is not None else 0

    @classmethod
    def from_settings(
        cls, settings: CacheSettings, clock: Callable[[], float] = time.time
    ) -> MemoryCache:
        return cls(settings.max_entries, settings.max_bytes, clock,
                   admission=settings.admission)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def bytes(self) -> int:
        return self._bytes

    def stats(self) -> MemoryStats:
        return MemoryStats(self.hits, self.misses, self.evictions, self.expirations,
                           len(self._data), self._bytes, self.rejections)

    # -- sync fast paths ---------------------------------------------------------------------

    def get(self, key: CacheKey) -> Entry | None:
        """The entry (fresh or stale, the caller decides) or ``None`` once past ``expires_at``."""
        pending = self._pending
        if pending is not None:  # admission on: count the lookup (in batches; sketch.py)
            pending.append(key)
            if len(pending) >= self._batch:
                self._flush_counts(pending)
        entry = self._data.get(key)
        if entry is None:
            self.misses += 1
            return None
        if entry.expires_at <= self.clock():
            self._remove(key, entry)
            self.expirations += 1
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return entry

    def set(self, key: CacheKey, entry: Entry) -> bool:
        """Store (replacing any older entry); False when it is already expired, too big, or a
        new key the admission filter keeps out."""
        data = self._data
        old = data.pop(key, None)
        if old is not None:
            self._bytes -= entry_size(old)
        size = entry_size(entry)
        now = self.clock()
        if size > self.max_bytes or entry.expires_at <= now:
            return False
        sketch = self._sketch
        if (old is None and sketch is not None and data
                and (len(data) >= self.max_entries or self._bytes + size > self.max_bytes)
                and not self._admit(sketch, key, now)):
            self.rejections += 1
            return False
        data[key] = entry
        self._bytes += size
        if len(self._data) > self.max_entries or self._bytes > self.max_bytes:
            self._shrink()
        return True

    def _flush_counts(self, pending: list[CacheKey]) -> None:
        if self._sketch is not None:
            self._sketch.flush(pending, hashed=False)

    def _admit(self, sketch: FrequencySketch, key: CacheKey, now: float) -> bool:
        """TinyLFU: does the new ``key`` earn a place? It is weighed against the least asked
        of the ``VICTIMS`` least recently used entries; if it wins, that entry goes first (the
        LRU order then makes the rest of the room). Ties go to the resident: a one-off key
        never displaces one asked as often. An expired entry among them is simply replaced."""
        data = self._data
        victim = None
        least = 1 << 30
        estimate = sketch.estimate
        for k, held in islice(data.items(), VICTIMS):
            if held.expires_at <= now:
                victim, least = k, -1
                break
            f = estimate(hash(k))
            if f < least:
                victim, least = k, f
        if victim is None or estimate(hash(key)) <= least:
            return False
        held = data.pop(victim)
        self._bytes -= entry_size(held)
        if least < 0:
            self.expirations += 1
        else:
            self.evictions += 1
        return True

    def delete(self, key: CacheKey) -> bool:
        entry = self._data.pop(key, None)
        if entry is None:
            return False
        self._bytes -= entry_size(entry)
        return True

    def _remove(self, key: CacheKey, entry: Entry) -> None:
        del self._data[key]
        self._bytes -= entry_size(entry)

    def _shrink(self) -> None:
        now = self.clock()
        data = self._data
        while len(data) > self.max_entries or self._bytes > self.max_bytes:
            _, entry = data.popitem(last=False)
            self._bytes -= entry_size(entry)
            if entry.expires_at <= now:
                self.expirations += 1
            else:
                self.evictions += 1

    def sweep(self, limit: int = 1000) -> int:
        """Drop up to ``limit`` expired entries (a periodic task may call it); returns the count.

        Scans at most ``limit`` entries from the LRU end, so one call stays short.
        """
        now = self.clock()
        dead = [k for k in islice(self._data, limit) if self._data[k].expires_at <= now]
        for key in dead:
            self._remove(key, self._data[key])
        self.expirations += len(dead)
        return len(dead)

    # -- CacheTier ---------------------------------------------------------------------------

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Entry | None]:
        get = self.get
        return [get(k) for k in keys]

    async def set_many(self, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        for key, entry in items:
            self.set(key, entry)

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        return sum(self.delete(k) for k in keys)

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        if model is None and scope is None:
            count = len(self._data)
            self._data.clear()
            self._bytes = 0
            return count
        # Compare scope tags, not raw scopes, so L1 and L2 purge exactly the same set.
        tag = None if scope is None else scope_tag(scope)
        doomed = [
            k for k in self._data
            if (model is None or k.model == model) and (tag is None or scope_tag(k.scope) == tag)
        ]
        for key in doomed:
            self._remove(key, self._data[key])
        return len(doomed)

    async def close(self) -> None:
        self._data.clear()
        self._bytes = 0
