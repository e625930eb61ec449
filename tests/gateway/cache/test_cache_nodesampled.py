"""The node tier's sampled eviction (gateway/cache/nodesampled.py): byte bound, eviction order,
admission against the victim, purges, layout switches, and two processes writing at once."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import xxhash

from gateway.cache import nodesampled
from gateway.cache.keys import CacheKey
from gateway.cache.nodesampled import SampledStore, _id
from gateway.cache.nodestore import GenerationStore, encode_key, pack

MiB = 1024 * 1024
NOW = 1_000_000.0


def raw(i: int, scope: str = "public", model: str = "minilm") -> bytes:
    key = CacheKey(model, scope, xxhash.xxh3_128_digest(i.to_bytes(8, "little")))
    out = encode_key(key)
    assert out is not None
    return out


def value(size: int = 1500, deadline: float = NOW + 3600) -> bytes:
    return pack(deadline, bytes(size))


class Counts:
    """A stand-in for the shared sketch: fixed counts per key."""

    def __init__(self, counts: dict[bytes, int]) -> None:
        self.counts = counts
        self.rejected = 0

    def estimate(self, raw: bytes) -> int:
        return self.counts.get(raw, 0)


def consistent(store: SampledStore) -> tuple[int, int]:
    """Checks the byte counter and the ids index against the entries; (entries, bytes)."""
    with store.env.begin() as txn:
        keys = [(k, len(k) + len(v)) for k, v in txn.cursor(db=store._db)]
        ids = [bytes(k) for k, _ in txn.cursor(db=store._ids)]
    assert sorted(ids) == sorted(_id(k) for k, _ in keys)
    total = sum(n for _, n in keys)
    assert store.data_bytes() == total
    return len(keys), total


def open_store(path: Path, max_bytes: int = MiB, **kw: object) -> SampledStore:
    return SampledStore(str(path), max_bytes, clock=lambda: NOW, **kw)  # type: ignore[arg-type]


def test_byte_bound_holds_under_mixed_sizes(tmp_path: Path) -> None:
    store = open_store(tmp_path, 2 * MiB)
    try:
        sizes = [100, 1500, 3000, 9000, 40]
        for batch in range(300):
            puts = [(raw(batch * 16 + j), value(sizes[(batch + j) % len(sizes)]))
                    for j in range(16)]
            result, _ = store.write(puts)  # never MapFullError
            assert result.bytes <= store.page_bound
        entries, total = consistent(store)
        assert total <= store.budget
        assert 0 < entries < 300 * 16
        assert store.used_bytes()[0] <= store.page_bound
    finally:
        store.close()


def test_not_full_takes_everything_and_reads_one_database(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        puts = [(raw(i), value()) for i in range(20)]
        result, _ = store.write(puts, admit=Counts({}))
        assert (result.stored, result.evicted, result.rejected) == (20, 0, 0)
        found, old = store.read([raw(3), raw(99), None])
        assert found[0] == puts[3][1] and found[1:] == [None, None] and old == []
    finally:
        store.close()


def fill(store: SampledStore, n: int, deadline: float = NOW + 3600, start: int = 0) -> None:
    for i in range(start, start + n):
        store.write([(raw(i), value(deadline=deadline))])


def capacity(store: SampledStore) -> int:
    return store.budget // (len(raw(0)) + len(value()))


def test_expired_entries_go_first(tmp_path: Path) -> None:
    store = open_store(tmp_path, samples=32)
    try:
        cap = capacity(store)
        fill(store, cap // 2, deadline=NOW - 1)  # past their deadline: never served again
        fill(store, cap - cap // 2, start=10_000)
        dead = {raw(i) for i in range(cap // 2)}
        before = {k for k, _ in store.env.begin().cursor(db=store._db)}
        store.write([(raw(50_000 + j), value()) for j in range(10)])
        after = {k for k, _ in store.env.begin().cursor(db=store._db)}
        gone = before - after
        assert len(gone) >= 10 and gone <= dead
    finally:
        store.close()


def test_without_admission_the_oldest_sampled_goes(tmp_path: Path) -> None:
    store = open_store(tmp_path, samples=32)
    try:
        cap = capacity(store)
        fill(store, cap // 2, deadline=NOW + 100)  # written earlier: earlier deadline
        fill(store, cap - cap // 2, deadline=NOW + 5000, start=10_000)
        old = {raw(i) for i in range(cap // 2)}
        before = {k for k, _ in store.env.begin().cursor(db=store._db)}
        store.write([(raw(50_000 + j), value(deadline=NOW + 9000)) for j in range(10)])
        gone = before - {k for k, _ in store.env.begin().cursor(db=store._db)}
        assert len(gone) >= 10 and gone <= old
    finally:
        store.close()


def test_admission_against_the_victim(tmp_path: Path) -> None:
    store = open_store(tmp_path, samples=4)
    try:
        cap = capacity(store)
        fill(store, cap)
        counts = Counts({raw(i): 5 for i in range(cap)})
        entries, _ = consistent(store)
        cold, hot = raw(90_000), raw(90_001)
        counts.counts[cold] = 5  # not more than the victim's: kept out (ties to the resident)
        counts.counts[hot] = 6
        result, _ = store.write([(cold, value())], admit=counts)
        assert (result.stored, result.rejected, counts.rejected) == (0, 1, 1)
        assert store.read([cold])[0] == [None]
        result, _ = store.write([(hot, value())], admit=counts)
        assert result.stored == 1 and result.evicted >= 1
        assert store.read([hot])[0][0] is not None
        # A refresh of a stored key always passes, whatever its count.
        result, _ = store.write([(raw(1), value(size=1400))], admit=Counts({}))
        assert result.stored == 1 and result.rejected == 0
        assert consistent(store)[0] <= entries
    finally:
        store.close()


def test_the_lowest_count_of_the_sample_is_the_victim(tmp_path: Path) -> None:
    store = open_store(tmp_path, samples=64)
    try:
        cap = capacity(store)
        fill(store, cap)
        weak = {raw(i) for i in range(0, cap, 4)}
        counts = Counts({raw(i): (1 if raw(i) in weak else 9) for i in range(cap)})
        counts.counts.update({raw(80_000 + j): 10 for j in range(5)})  # above every bar
        before = {k for k, _ in store.env.begin().cursor(db=store._db)}
        result, _ = store.write([(raw(80_000 + j), value()) for j in range(5)], admit=counts)
        gone = before - {k for k, _ in store.env.begin().cursor(db=store._db)}
        assert result.stored == 5
        assert len(gone) >= 5 and gone <= weak
    finally:
        store.close()


class Probes:
    """Stands in for the store's ``random.Random``: each draw lands exactly on the next key."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = list(keys)

    def getrandbits(self, bits: int) -> int:
        assert bits == 128
        return int.from_bytes(_id(self.keys.pop(0))[:16], "little")


@pytest.mark.parametrize(("count", "admitted"), [(4, False), (5, True)])
def test_the_bar_is_the_second_least_counted_sample(tmp_path: Path, count: int,
                                                    admitted: bool) -> None:
    """Five samples counted 9, 1, 9, 4, 9: the one counted 1 is the victim, and a newcomer must
    be counted more than 4 (the second least) to take its place, not more than 1 (a bar that
    lets one-off keys churn in) nor than the first sample's 9."""
    store = open_store(tmp_path, samples=5)
    try:
        cap = capacity(store)
        fill(store, cap)
        drawn = [raw(i) for i in (3, 7, 11, 15, 19)]
        counts = Counts({raw(i): 9 for i in range(cap)})
        counts.counts.update({drawn[1]: 1, drawn[3]: 4})
        new = raw(70_000)
        counts.counts[new] = count
        store._random = Probes(drawn * 8)  # type: ignore[assignment]
        before = {k for k, _ in store.env.begin().cursor(db=store._db)}
        result, _ = store.write([(new, value())], admit=counts)
        gone = before - {k for k, _ in store.env.begin().cursor(db=store._db)}
        if admitted:
            assert (result.stored, result.rejected) == (1, 0)
            assert gone == {drawn[1]}  # the least counted, though drawn second
        else:
            assert (result.stored, result.rejected, counts.rejected) == (0, 1, 1)
            assert gone == set()
    finally:
        store.close()


def test_ties_go_to_the_first_drawn_not_the_lowest_key(tmp_path: Path) -> None:
    """Among samples counted alike, the first drawn goes (a random one), not the one whose key
    sorts first: a victim chosen by key order would always take the lowest digests, leaving a
    gap in the id space that concentrates every later probe on the entry after it."""
    store = open_store(tmp_path, samples=5)
    try:
        cap = capacity(store)
        fill(store, cap)
        drawn = sorted((raw(i) for i in (3, 7, 11, 15, 19)), key=_id, reverse=True)
        counts = Counts({raw(i): 9 for i in range(cap)})
        new = raw(70_002)
        counts.counts[new] = 10
        store._random = Probes(drawn * 8)  # type: ignore[assignment]
        before = {k for k, _ in store.env.begin().cursor(db=store._db)}
        result, _ = store.write([(new, value())], admit=counts)
        gone = before - {k for k, _ in store.env.begin().cursor(db=store._db)}
        assert result.stored == 1 and gone == {drawn[0]}
    finally:
        store.close()


def test_an_expired_sample_is_evicted_whatever_the_bar(tmp_path: Path) -> None:
    store = open_store(tmp_path, samples=5)
    try:
        cap = capacity(store)
        fill(store, cap)
        dead = raw(5)
        store.write([(dead, value(deadline=NOW - 1))])  # a refresh: now past its deadline
        drawn = [raw(3), dead, raw(11), raw(15), raw(19)]
        counts = Counts({raw(i): 9 for i in range(cap)})
        new = raw(70_001)  # counted 0: below every live sample
        store._random = Probes(drawn * 8)  # type: ignore[assignment]
        result, _ = store.write([(new, value())], admit=counts)
        assert (result.stored, result.rejected) == (1, 0)
        assert store.read([dead])[0] == [None] and store.read([new])[0][0] is not None
    finally:
        store.close()


def test_samples_written_by_the_same_write_are_passed_over(tmp_path: Path) -> None:
    """Each new entry of a batch may evict, but never one written earlier in that batch: the
    batch's own entries all get in and stay readable after it, though they are the oldest (the
    earliest deadline) and so the first victims of any sample holding one."""
    store = open_store(tmp_path, samples=8)
    store._random.seed(3)
    try:
        cap = capacity(store)
        fill(store, cap, deadline=NOW + 9000)
        batch = [raw(60_000 + j) for j in range(cap // 2)]
        result, _ = store.write([(k, value(deadline=NOW + 100)) for k in batch])
        assert (result.stored, result.rejected) == (len(batch), 0)
        found, _ = store.read(batch)
        assert all(v is not None for v in found)
        assert consistent(store)[0] <= cap
    finally:
        store.close()


def test_purge_and_deletes_keep_the_counter(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        store.write([(raw(i, scope="a"), value()) for i in range(10)]
                    + [(raw(i, scope="b", model="other"), value()) for i in range(10)])
        _, deleted = store.write([], deletes=[raw(0, scope="a"), raw(0, scope="zzz")])
        assert deleted == 1
        removed, _ = store.purge("other", None)
        assert removed == 10
        assert consistent(store)[0] == 9
        removed, _ = store.purge(None, None)
        assert removed == 9 and consistent(store) == (0, 0)
    finally:
        store.close()


def test_switching_layouts_starts_empty(tmp_path: Path) -> None:
    gens = GenerationStore(str(tmp_path), MiB)
    gens.write([(raw(i), value()) for i in range(10)], [])
    gens.close()
    store = open_store(tmp_path)
    assert store.used_bytes()[1] == 0
    store.write([(raw(1), value())])
    store.close()
    gens = GenerationStore(str(tmp_path), MiB)
    try:
        assert gens.used_bytes()[1] == 0
        assert gens.read([raw(1)])[0] == [None]
    finally:
        gens.close()


def _writer(path: str, start: int, rounds: int) -> None:
    # 4 MiB: a budget of ~1,200 of these entries for the 2,400 written, so each process's
    # last writes are still there at the end, however the two interleaved.
    store = SampledStore(path, 4 * MiB, clock=lambda: NOW)
    try:
        for r in range(rounds):
            base = start + r * 8
            store.write([(raw(base + j), value(size=900 + 97 * j)) for j in range(8)],
                        deletes=[raw(base - 40)] if r % 5 == 0 and r >= 5 else ())
    finally:
        store.close()


def test_two_processes_keep_the_bound_and_the_counter(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), n * 1_000_000, 150), daemon=True)
             for n in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=10)
    store = open_store(tmp_path, 4 * MiB)
    try:
        entries, total = consistent(store)
        assert total <= store.budget and 0 < entries < 2 * 150 * 8
        assert store.used_bytes()[0] <= store.page_bound
        with store.env.begin() as txn:
            mine = {bytes(k)[-16:] for k, _ in txn.cursor(db=store._db)}
        both = [any(raw(n * 1_000_000 + i)[-16:] in mine for i in range(1100, 1200))
                for n in range(2)]
        assert all(both)  # each process's writes are there, in one consistent tree
    finally:
        store.close()


def test_settings_choose_the_store() -> None:
    from gateway.cache.settings import NodeCacheSettings
    from gateway.validation import SettingsError

    assert NodeCacheSettings().eviction == "sampled"
    with pytest.raises(SettingsError):
        NodeCacheSettings(eviction="lru")
    assert nodesampled.SAMPLES >= 1


def test_a_write_never_evicts_what_it_just_wrote(tmp_path: Path) -> None:
    store = open_store(tmp_path, MiB)
    try:
        fill(store, capacity(store))
        for n in range(200):  # full, with mixed sizes: the bytes loop and the page guard evict
            puts = [(raw(70_000 + n * 3 + j), value(size=300 + 1900 * j)) for j in range(3)]
            store.write(puts)
            assert all(v is not None for v in store.read([r for r, _ in puts])[0]), n
    finally:
        store.close()
