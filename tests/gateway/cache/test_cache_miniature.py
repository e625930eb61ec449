"""The L1's sketch period, chosen by miniature simulations (gateway/cache/miniature.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gateway.cache import miniature
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.memory import MemoryCache
from gateway.cache.miniature import PeriodChooser
from gateway.cache.sketch import hashes_of
from gateway.cache.tiered import TieredCache
from gateway.telemetry.observer import NullObserver

NOW = 1_000_000.0


def key(i: int) -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1",
                      scope="tenant-a", normalization="n1", canonical=f"text {i}".encode())


class Fake:
    """A miniature whose hits the test sets; it records what it is asked."""

    def __init__(self, entries: int, sample: int) -> None:
        self.max_entries = entries
        self.sample = sample
        self.hits = 0
        self.asked: list[CacheKey] = []
        self.resized: list[int] = []

    def get(self, k: CacheKey) -> Entry | None:
        self.asked.append(k)
        return None

    def set(self, k: CacheKey, entry: Entry) -> bool:
        return True

    def resize(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.resized.append(max_entries)


def fakes() -> tuple[list[Fake], Callable[[int, int], Fake]]:
    """The miniatures a chooser makes, and the factory it makes them with."""
    made: list[Fake] = []

    def make(entries: int, sample: int) -> Fake:
        made.append(Fake(entries, sample))
        return made[-1]

    return made, make


def test_the_chooser_takes_the_period_whose_miniature_hit_more_by_a_margin() -> None:
    made, make = fakes()
    chooser = PeriodChooser(100, make, periods=(40, 320))
    short, long = made
    # Each miniature halves at its period x the cache's entries (rate 1: every lookup seen).
    assert (short.max_entries, short.sample, long.sample) == (100, 4_000, 32_000)
    assert chooser.period == 40 and chooser.epoch == miniature.EPOCH * 100
    batch = [key(i) for i in range(chooser.epoch)]
    assert chooser.observe(batch[:-1], hashes_of(batch[:-1])) is None  # the epoch is not over
    assert short.asked == batch[:-1] == long.asked
    short.hits, long.hits = 1000, 1020  # 2% more: inside the margin, no flapping
    assert chooser.observe(batch[-1:], hashes_of(batch[-1:])) == 40
    assert short.hits == long.hits == 0  # each epoch counts afresh
    short.hits, long.hits = 1000, 1200  # scores 1500 vs 1710: past the margin
    assert chooser.observe(batch, hashes_of(batch)) == 320
    assert chooser.switches == 1
    # The earlier epochs weigh DECAY each: the short one wins back only once its hits show.
    short.hits, long.hits = 1100, 1000
    assert chooser.observe(batch, hashes_of(batch)) == 320  # 1850 vs 1855
    short.hits, long.hits = 1200, 900
    assert chooser.observe(batch, hashes_of(batch)) == 40  # 2125 vs 1827.5
    assert chooser.switches == 2


def test_a_large_cache_replays_a_fixed_sample_of_its_keys() -> None:
    made, make = fakes()
    chooser = PeriodChooser(100_000, make)
    rate = chooser.rate
    assert rate > 1 and rate & (rate - 1) == 0  # a power of two
    assert made[0].max_entries == 100_000 // rate <= miniature.MINIATURE_ENTRIES
    assert 100_000 // (rate // 2) > miniature.MINIATURE_ENTRIES  # the least sample that fits
    assert made[0].sample == miniature.PERIODS[0] * 100_000 // rate
    keys = [key(i) for i in range(1_000 * rate)]
    for start in range(0, len(keys), 256):
        chunk = keys[start:start + 256]
        chooser.observe(chunk, hashes_of(chunk))
    first = list(made[0].asked)
    assert 850 <= len(first) <= 1150  # ~1 in rate
    # A key is in the sample or not, whatever batch it comes in: every lookup of it is seen.
    made[0].asked.clear()
    chooser.observe(keys[::-1], hashes_of(keys[::-1]))
    assert sorted(made[0].asked, key=hash) == sorted(first, key=hash)


def test_the_miniatures_follow_what_the_cache_holds() -> None:
    made, make = fakes()
    chooser = PeriodChooser(500, make)
    assert chooser.rate == 1
    chooser.resize(460)  # within a tenth: left as they are
    assert made[0].resized == made[1].resized == []
    chooser.resize(150)
    assert made[0].resized == made[1].resized == [150]
    assert made[0].sample == miniature.PERIODS[0] * 500  # the period stays the cache's


def test_a_cache_bounded_by_bytes_holds_what_its_bytes_allow() -> None:
    cache = MemoryCache(1_000, 10 * 2_000, clock=lambda: NOW, admission=True)
    assert cache._holds() == 64  # not full yet: what the byte bound allows of typical answers
    for i in range(40):
        cache.set(key(i), Entry(bytes(1_700), NOW, 1e9))
    assert 0 < len(cache) < 12
    assert cache._holds() == len(cache)


def test_resize_bounds_the_entries_at_the_next_store() -> None:
    cache = MemoryCache(500, 1 << 40, clock=lambda: NOW, admission=True, miniatures=False)
    for i in range(500):
        cache.set(key(i), Entry(b"x", NOW, 1e9))
    assert len(cache) == 500
    cache.resize(100)
    cache.set(key(10_000), Entry(b"x", NOW, 1e9))
    assert len(cache) <= 100


def _replay(cache: MemoryCache, trace: np.ndarray) -> int:
    keys = [key(i) for i in range(int(trace.max()) + 1)]
    hits = 0
    for k in trace.tolist():
        if cache.get(keys[k]) is not None:
            hits += 1
        else:
            cache.set(keys[k], Entry(b"x", NOW, 1e9))
    return hits


def _zipf(rng: np.random.Generator, alpha: float, n: int, universe: int) -> np.ndarray:
    p = 1.0 / np.arange(1, universe + 1) ** alpha
    return rng.choice(universe, size=n, p=p / p.sum())


def test_the_l1_takes_the_long_period_when_popularity_holds_and_the_short_one_when_it_moves(
) -> None:
    rng = np.random.default_rng(27)
    # A steady, flat popularity: a long memory tells the popular keys from chance.
    steady = _zipf(rng, 0.6, 60_000, 5_000)
    chosen = MemoryCache(100, 1 << 40, clock=lambda: NOW, admission=True)
    fixed = MemoryCache(100, 1 << 40, clock=lambda: NOW, admission=True, miniatures=False)
    assert chosen.period == fixed.period == 40
    got, short = _replay(chosen, steady), _replay(fixed, steady)
    assert chosen.period == 320
    assert got > short * 1.02
    # The popular set reshuffled every 3,000 lookups: yesterday's keys must be forgotten.
    shifting = np.concatenate([rng.permutation(5_000)[_zipf(rng, 0.8, 3_000, 5_000)]
                               for _ in range(20)])
    chosen = MemoryCache(100, 1 << 40, clock=lambda: NOW, admission=True)
    long = MemoryCache(100, 1 << 40, clock=lambda: NOW, admission=True, miniatures=False,
                       sample=320 * 100)
    got, stale = _replay(chosen, shifting), _replay(long, shifting)
    assert chosen.period == 40
    assert got > stale * 1.02


class Periods(NullObserver):
    def __init__(self) -> None:
        self.told: list[tuple[str, int]] = []

    def cache_sketch_period(self, tier: str, lookups_per_entry: int) -> None:
        self.told.append((tier, lookups_per_entry))


async def test_the_tiered_cache_tells_the_metrics_the_period_the_l1_took() -> None:
    told = Periods()
    l1 = MemoryCache(100, 1 << 40, clock=lambda: NOW, admission=True)
    cache = TieredCache(l1, None, observer=told)
    keys = [key(i) for i in range(5_000)]
    trace = _zipf(np.random.default_rng(27), 0.6, 60_000, 5_000).tolist()
    for k in trace:
        [(found, _)] = await cache.get_many([keys[k]])
        if found is None:
            await cache.set_many([(keys[k], Entry(b"x", NOW, 1e9))])
    # Told at the first store, then at each change: the miniatures chose the long period.
    # Near the 3% margin a process's hash salt (the L1 samples keys by ``hash()``) can make
    # the choice flap back and forth once more (seen once in a CI run): every change is told,
    # and the last told is the period in force.
    assert told.told[:2] == [("l1", 40), ("l1", 320)]
    assert all(a != b for a, b in zip(told.told, told.told[1:], strict=False))
    assert told.told[-1] == ("l1", l1.period)
    plain = Periods()  # an LRU has no sketch: nothing to tell
    lru = TieredCache(MemoryCache(100, 1 << 40, clock=lambda: NOW), None, observer=plain)
    await lru.set_many([(keys[0], Entry(b"x", NOW, 1e9))])
    assert plain.told == []
