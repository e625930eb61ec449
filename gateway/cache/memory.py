"""L1: the in-process cache, bounded by entry count and by bytes, with per-entry expiry.

Without admission (``cache.admission: false``) it is a plain LRU: one ``OrderedDict`` in
recency order (``move_to_end`` on a hit, the least recent evicted first).

With admission (the default) it is a W-TinyLFU, as in Caffeine (Einziger, Friedman and Manes,
"TinyLFU", 2017), over three ``OrderedDict`` segments in recency order:

- the **window** (``WINDOW`` of the entry bound, ``WINDOW_BYTES`` of the byte bound; none for
  caches under ``1 / WINDOW`` entries): every new key enters here, so a key asked twice in a
  row hits whatever its history;
- **probation** and **protected** (``PROTECTED`` of the rest), the main space, a segmented
  LRU: a key the window pushes out lands at probation's recent end; a hit in probation moves it
  to protected, whose overflow goes back to probation's recent end.

When the whole is over a bound, the keys pushed out of the window (candidates) are weighed,
oldest first, against probation's least recent key (the victim) by how often each was asked
lately (a count-min sketch of every lookup, ``sketch.py``): the less asked goes, ties to the
victim. A scan of one-off texts thus passes through the window and out, and the keys everybody
repeats stay. How long the sketch remembers (its halving period: 40 or 320 lookups per entry)
is chosen by replaying the lookups through two key-only miniatures of this cache, one per
period (``miniature.py``). Replacing a stored key (a refresh, stale-while-revalidate) keeps
its place and always passes; an expired entry met as candidate or victim simply goes. Scope is
in the key, so every tenant's keys are counted and weighed apart.

Expired entries are otherwise dropped lazily: when looked up past their ``expires_at``, when
weighed, or by ``sweep``. Everything runs on the event loop thread, so the sync
``get``/``set`` are safe and let the pipeline's hit path skip an ``await``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, scope_tag
from gateway.cache.miniature import PeriodChooser
from gateway.cache.settings import CacheSettings
from gateway.cache.sketch import FrequencySketch, hashes_of

#: Rough per-entry cost beyond the value and meta bytes (key, Entry object, dict node), so that
#: many tiny entries still count against ``max_bytes``.
ENTRY_OVERHEAD = 240
#: What an entry weighs, about (one 384-d float32 answer and the overhead): sizes the sketch.
TYPICAL_ENTRY = 2048
#: The admission window's share of the entry bound (Caffeine's 1%).
WINDOW = 0.01
#: Its share of the byte bound. Replayed by bytes (bench hitratio, answers of mixed sizes):
#: 1% -> 0.2% lifts L1 on every trace at 1-10% of the bytes (+0.001 to +0.033; shift-0.8 at
#: 5%: 0.338 -> 0.357) and is mixed at 0.2-0.5% (tenants-4 at 0.2%: -0.029); 0.1% loses
#: shift-0.8 at 1%. By entries the window's size hardly matters on these traces.
WINDOW_BYTES = 0.002
#: Probation's least recent entries a candidate is weighed against (the least asked of them
#: goes if the candidate was asked more). Caffeine weighs one; replayed (bench hitratio), 8 win
#: the shifting working set back (shift-0.8 at 5%: 0.85 -> 0.91 of the oracle) and cost
#: nothing on the Zipf traces.
VICTIMS = 8
#: Sketch counters per row per entry (``sketch.WIDTH_FACTOR``): ~5 bytes of table per entry x 16.
SKETCH_WIDTH = 16
#: Protected's share of the main space (the rest is probation), by both bounds.
PROTECTED = 0.8

Segment = OrderedDict[CacheKey, Entry]


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
    rejections: int = 0  # new keys the admission filter kept out (weighed and lost)


class MemoryCache:
    """Bounded in-process tier with TTL: an LRU, or a W-TinyLFU with ``admission`` (see the
    module docstring)."""

    name = "l1"

    def __init__(
        self, max_entries: int, max_bytes: int, clock: Callable[[], float] = time.time,
        *, admission: bool = False, sample: int | None = None, miniatures: bool = True,
    ) -> None:
        # Bounds are CacheSettings' to check (settings section ``cache``).
        self.max_bytes = max_bytes
        self.clock = clock
        # Without admission only protected is used, as the one LRU.
        self._window: Segment = OrderedDict()
        self._probation: Segment = OrderedDict()
        self._protected: Segment = OrderedDict()
        self._bytes = 0
        self._window_bytes = 0
        self._protected_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.expirations = 0
        self.rejections = 0
        self._admission = admission
        self.resize(max_entries)
        # Sized for the entries the cache can hold: a byte bound may allow far fewer.
        held = min(max_entries, max(64, max_bytes // TYPICAL_ENTRY))
        self._held = held
        # The sketch's halving period, chosen by miniature copies of this cache (miniature.py).
        self._chooser = (PeriodChooser(held, self._miniature)
                         if admission and miniatures else None)
        if self._chooser is not None:
            sample = self._chooser.period * held
        self._sketch = (FrequencySketch(held, sample=sample, width_factor=SKETCH_WIDTH)
                        if admission else None)
        self._pending: list[CacheKey] | None = [] if admission else None
        self._batch = self._sketch.batch if self._sketch is not None else 0

    def resize(self, max_entries: int) -> None:
        """Set the entry bound and the segments' shares of both bounds (a miniature follows
        what its cache holds this way); entries over a lower bound go at the next store."""
        self.max_entries = max_entries
        window = int(max_entries * WINDOW) if self._admission else 0
        self._window_entries = window
        self._window_max_bytes = int(self.max_bytes * WINDOW_BYTES) if window else 0
        self._protected_entries = (int((max_entries - window) * PROTECTED)
                                   if self._admission else 0)
        self._protected_max_bytes = int((self.max_bytes - self._window_max_bytes) * PROTECTED)

    def _miniature(self, entries: int, sample: int) -> MemoryCache:
        """A key-only copy of this cache: ``entries`` bound it (never its bytes), its sketch
        halves every ``sample`` of the lookups it sees."""
        return MemoryCache(entries, 1 << 62, self.clock, admission=True, sample=sample,
                           miniatures=False)

    def _holds(self) -> int:
        """The entries this cache holds when full: its entry bound, or what its byte bound
        lets it hold of the answers it stores (once the bytes are nearly all used)."""
        if self._bytes >= self.max_bytes * 0.9 and len(self) < self.max_entries:
            return len(self)
        return self._held

    @property
    def period(self) -> int:
        """The sketch's halving period now, lookups per entry (0 without admission)."""
        return self._sketch.sample // self._held if self._sketch is not None else 0

    @classmethod
    def from_settings(
        cls, settings: CacheSettings, clock: Callable[[], float] = time.time
    ) -> MemoryCache:
        return cls(settings.max_entries, settings.max_bytes, clock,
                   admission=settings.admission)

    def __len__(self) -> int:
        return len(self._window) + len(self._probation) + len(self._protected)

    @property
    def bytes(self) -> int:
        return self._bytes

    def stats(self) -> MemoryStats:
        return MemoryStats(self.hits, self.misses, self.evictions, self.expirations,
                           len(self), self._bytes, self.rejections)

    def _segments(self) -> tuple[Segment, Segment, Segment]:
        return self._window, self._probation, self._protected

    def _segment_of(self, key: CacheKey) -> Segment | None:
        for seg in (self._protected, self._window, self._probation):
            if key in seg:
                return seg
        return None

    # -- sync fast paths ---------------------------------------------------------------------

    def get(self, key: CacheKey) -> Entry | None:
        """The entry (fresh or stale, the caller decides) or ``None`` once past ``expires_at``."""
        pending = self._pending
        if pending is not None:  # admission on: count the lookup (in batches; sketch.py)
            pending.append(key)
            if len(pending) >= self._batch:
                self._flush_counts(pending)
        # Protected holds most of what is hit; the other segments are looked at after it.
        entry = self._protected.get(key)
        if entry is None:
            return self._get_other(key)
        if entry.expires_at <= self.clock():
            self._remove(self._protected, key, entry)
            self.expirations += 1
            self.misses += 1
            return None
        self._protected.move_to_end(key)
        self.hits += 1
        return entry

    def _get_other(self, key: CacheKey) -> Entry | None:
        seg = self._window
        entry = seg.get(key)
        if entry is None:
            seg = self._probation
            entry = seg.get(key)
            if entry is None:
                self.misses += 1
                return None
        if entry.expires_at <= self.clock():
            self._remove(seg, key, entry)
            self.expirations += 1
            self.misses += 1
            return None
        self.hits += 1
        if seg is self._probation:
            self._promote(key, entry)
        else:
            seg.move_to_end(key)
        return entry

    def _promote(self, key: CacheKey, entry: Entry) -> None:
        """A hit in probation: to protected's recent end; protected's overflow (its least
        recent entries) back to probation's recent end."""
        del self._probation[key]
        protected = self._protected
        protected[key] = entry
        self._protected_bytes += entry_size(entry)
        while len(protected) > 1 and (len(protected) > self._protected_entries
                                      or self._protected_bytes > self._protected_max_bytes):
            k, e = protected.popitem(last=False)
            self._protected_bytes -= entry_size(e)
            self._probation[k] = e

    def set(self, key: CacheKey, entry: Entry) -> bool:
        """Store (replacing any older entry); False when it is already expired, too big, or a
        new key the admission filter keeps out at once (a cache without a window)."""
        old_seg = self._segment_of(key)
        if old_seg is not None:
            old = old_seg.pop(key)
            self._account(old_seg, -entry_size(old))
        size = entry_size(entry)
        now = self.clock()
        if size > self.max_bytes or entry.expires_at <= now:
            return False
        if old_seg is not None:  # a replacement keeps its segment, at the recent end
            seg = old_seg
        elif self._window_entries:
            seg = self._window
        elif self._sketch is not None:
            seg = self._probation
        else:  # no admission: protected is the one LRU (looked at first by ``get``)
            seg = self._protected
        seg[key] = entry
        self._account(seg, size)
        if self._window and (len(self._window) > self._window_entries
                             or self._window_bytes > self._window_max_bytes):
            candidates = self._spill_window()
        elif old_seg is None and seg is self._probation and self._sketch is not None:
            candidates = [key]
        else:
            candidates = []
        if len(self) > self.max_entries or self._bytes > self.max_bytes:
            self._evict(candidates, now)
        return key in seg

    def _account(self, seg: Segment, delta: int) -> None:
        self._bytes += delta
        if seg is self._window:
            self._window_bytes += delta
        elif seg is self._protected:
            self._protected_bytes += delta

    def _spill_window(self) -> list[CacheKey]:
        """Move the window's least recent entries to probation's recent end until the window
        is within its bounds; returns their keys, oldest first (the candidates)."""
        window, probation = self._window, self._probation
        moved: list[CacheKey] = []
        while window and (len(window) > self._window_entries
                          or self._window_bytes > self._window_max_bytes):
            k, e = window.popitem(last=False)
            self._window_bytes -= entry_size(e)
            probation[k] = e
            moved.append(k)
        return moved

    def _evict(self, candidates: list[CacheKey], now: float) -> None:
        """Evict until within both bounds. Candidates (keys just moved to probation, oldest
        first) are weighed against the least asked of probation's ``VICTIMS`` least recent
        keys (an expired one among them goes first); with none (or without
        admission) the least recent entry goes, from probation, then protected, then the
        window."""
        probation = self._probation
        sketch = self._sketch
        c = 0
        while len(self) > self.max_entries or self._bytes > self.max_bytes:
            if not probation:
                seg = self._protected if self._protected else self._window
                _, e = seg.popitem(last=False)
                self._account(seg, -entry_size(e))
                self._count_out(e, now)
                continue
            victim = next(iter(probation))
            while c < len(candidates) and candidates[c] not in probation:
                c += 1  # a candidate already gone (evicted as a victim itself)
            if sketch is None or c == len(candidates) or victim == candidates[c]:
                e = probation.pop(victim)
                self._bytes -= entry_size(e)
                self._count_out(e, now)
                continue
            cand = candidates[c]
            estimate = sketch.estimate
            least = 1 << 30
            for k, e in islice(probation.items(), VICTIMS):
                if k == cand:  # the candidates are probation's most recent entries
                    break
                if e.expires_at <= now:  # an expired entry simply goes
                    victim, least = k, -1
                    break
                f = estimate(hash(k))
                if f < least:
                    victim, least = k, f
            held, new = probation[victim], probation[cand]
            if least < 0 or (new.expires_at > now and estimate(hash(cand)) > least):
                del probation[victim]
                self._bytes -= entry_size(held)
                self._count_out(held, now)
            else:
                del probation[cand]
                self._bytes -= entry_size(new)
                c += 1
                if new.expires_at <= now:
                    self.expirations += 1
                else:
                    self.rejections += 1

    def _count_out(self, entry: Entry, now: float) -> None:
        if entry.expires_at <= now:
            self.expirations += 1
        else:
            self.evictions += 1

    def _flush_counts(self, pending: list[CacheKey]) -> None:
        sketch, chooser = self._sketch, self._chooser
        if sketch is None:
            return
        if chooser is None:
            sketch.flush(pending, hashed=False)
            return
        h = hashes_of(pending)
        period = chooser.observe(pending, h)
        pending.clear()
        sketch.count(h)
        if period is not None:
            sketch.sample = period * self._held
            chooser.resize(self._holds())

    def delete(self, key: CacheKey) -> bool:
        seg = self._segment_of(key)
        if seg is None:
            return False
        self._account(seg, -entry_size(seg.pop(key)))
        return True

    def _remove(self, seg: Segment, key: CacheKey, entry: Entry) -> None:
        del seg[key]
        self._account(seg, -entry_size(entry))

    def sweep(self, limit: int = 1000) -> int:
        """Drop up to ``limit`` expired entries (a periodic task may call it); returns the count.

        Scans at most ``limit`` entries, from the least recent end of each segment, so one
        call stays short.
        """
        now = self.clock()
        dead: list[tuple[Segment, CacheKey]] = []
        seen = 0
        for seg in (self._probation, self._window, self._protected):
            for k in islice(seg, limit - seen):
                if seg[k].expires_at <= now:
                    dead.append((seg, k))
            seen += min(len(seg), limit - seen)
            if seen >= limit:
                break
        for seg, key in dead:
            self._remove(seg, key, seg[key])
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
            count = len(self)
            self._clear()
            return count
        # Compare scope tags, not raw scopes, so L1 and L2 purge exactly the same set.
        tag = None if scope is None else scope_tag(scope)
        doomed = [
            (seg, k) for seg in self._segments() for k in seg
            if (model is None or k.model == model) and (tag is None or scope_tag(k.scope) == tag)
        ]
        for seg, key in doomed:
            self._remove(seg, key, seg[key])
        return len(doomed)

    def _clear(self) -> None:
        for seg in self._segments():
            seg.clear()
        self._bytes = self._window_bytes = self._protected_bytes = 0

    async def close(self) -> None:
        self._clear()
