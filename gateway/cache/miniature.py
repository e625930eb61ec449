"""The L1's memory length, chosen by miniature simulations of the L1 itself.

A TinyLFU's sketch halves its counts every *period* lookups (``sketch.py``), and no one period
suits every traffic: a long one ranks a stable but flat popularity (Zipf 0.6) close to the
frequency oracle, where a short one mistakes chance for popularity; a short one follows a
popular set that moves, where a long one keeps yesterday's keys. Replayed on the traces of
``bench hitratio``, a period of 320 lookups per entry beats the shipped 40 by up to 0.07 of
the oracle on Zipf traces at 1% of the keys, and loses the shifting working set (a reshuffle
every 20,000 requests) outright.

So the L1 runs its own lookups through miniature copies of itself, one per candidate period
(the miniature-simulation method of Waldspurger et al., "Cache Modeling and Optimization using
Miniature Simulations", USENIX ATC 2017), and takes the period of the one that hits most:

- a miniature is a real ``MemoryCache`` (the same window, segments, victims and sketch) that
  holds keys only (one shared empty entry), ``1 / rate`` of the L1's entries, at most
  ``MINIATURE_ENTRIES``; it sees the lookups whose key hash falls in a ``1 / rate`` sample
  (spatial sampling: every lookup of a sampled key, none of the others), so it faces the same
  popularity at the same scale as the L1;
- every ``EPOCH`` sampled lookups per miniature entry the hits of each are added to its score
  (the previous score weighed ``DECAY``), and the L1's sketch takes the best one's period if
  it beat the period in use by more than ``MARGIN`` (two that do about as well do not flap).

Comparing two policies on the same requests is far less noisy than comparing one cache's hit
ratio from one stretch of time to the next (a hill-climber on the period was tried and could
not tell a shift from chance: bench/RESULTS.md, "what a frequency cache can reach"). The cost
is the miniatures' own lookups: ``rate`` is chosen so that a large L1 replays a sample, and
only the keys of the L1's counted batches are sampled (one numpy pass per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey

#: Candidate halving periods, lookups per entry; the first is where the L1 starts.
PERIODS = (40, 320)
#: Entries of a miniature at most (a larger L1 is sampled at ``1 / rate``): 1 in 256 for the
#: default 100,000. A 1-in-16 sample (125 entries) still chose as well as every lookup on a
#: replayed trace of 1,000,000 requests; a miniature's cost is its misses (bench/RESULTS.md).
MINIATURE_ENTRIES = 512
#: Sampled lookups per miniature entry between two choices.
EPOCH = 10
#: The weight of the earlier epochs' hits in a choice.
DECAY = 0.5
#: How much more a miniature must hit than the one in use to take over (no flapping between
#: two periods that do about as well).
MARGIN = 0.03
#: Knuth's multiplicative constant: the sample is read from the product's top bits, so it does
#: not follow the bits the sketches index their rows by.
_MIX = np.uint64(0x9E3779B97F4A7C15)
#: What a miniature stores: keys only (never expires: the miniatures count hits, not answers).
_TOKEN = Entry(b"", 0.0, float("inf"))


class Miniature(Protocol):
    hits: int
    max_entries: int

    def get(self, key: CacheKey) -> Entry | None: ...

    def set(self, key: CacheKey, entry: Entry) -> bool: ...

    def resize(self, max_entries: int) -> None: ...


class PeriodChooser:
    """Miniatures of a cache of ``entries`` whose sketch halves every period x ``entries``
    lookups, one per period of ``periods``, made by ``make(entries, sample)`` (``sample``: its
    sketch's halving period in the lookups it sees); ``observe`` each counted batch, use the
    period it returns, and ``resize`` when the cache holds other than ``entries``."""

    def __init__(self, entries: int, make: Callable[[int, int], Miniature], *,
                 periods: Sequence[int] = PERIODS) -> None:
        rate = 1
        while entries // rate > MINIATURE_ENTRIES:
            rate <<= 1
        self.rate = rate
        self._shift = np.uint64(64 - (rate.bit_length() - 1))
        size = max(1, entries // rate)
        self.periods = tuple(periods)
        self.minis = [make(size, max(1, p * entries // rate)) for p in self.periods]
        self.scores = [0.0] * len(self.periods)
        self.chosen = 0
        self.switches = 0
        self.epoch = EPOCH * size
        self._seen = 0

    def resize(self, entries: int) -> None:
        """The cache holds ``entries`` when full (a byte bound may hold fewer than its entry
        bound): the miniatures follow when that moved by more than a tenth."""
        size = max(1, entries // self.rate)
        if abs(size - self.minis[0].max_entries) * 10 > self.minis[0].max_entries:
            for mini in self.minis:
                mini.resize(size)

    @property
    def period(self) -> int:
        return self.periods[self.chosen]

    def observe(self, keys: Sequence[CacheKey], hashes: Any) -> int | None:
        """Replay the sampled lookups of one batch (``hashes``: the keys' ``hash()`` as a
        ``uint64`` array) through the miniatures; at an epoch's end, the period to use now."""
        if self.rate > 1:
            picked = np.flatnonzero((hashes * _MIX) >> self._shift == 0).tolist()
            keys = [keys[i] for i in picked]
        for mini in self.minis:
            get, put = mini.get, mini.set
            for key in keys:
                if get(key) is None:
                    put(key, _TOKEN)
        self._seen += len(keys)
        if self._seen < self.epoch:
            return None
        self._seen = 0
        for i, mini in enumerate(self.minis):
            self.scores[i] = DECAY * self.scores[i] + mini.hits
            mini.hits = 0
        best = max(range(len(self.minis)), key=self.scores.__getitem__)
        if self.scores[best] > self.scores[self.chosen] * (1.0 + MARGIN):
            self.chosen = best
            self.switches += 1
        return self.periods[self.chosen]
