"""TinyLFU admission: the sketch, the L1 filter, the node tier's shared counts, the recorder."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.memory import MemoryCache
from gateway.cache.nodeadmit import NodeAdmission
from gateway.cache.sketch import FrequencySketch
from gateway.cache.tracefile import MAGIC, RECORD, TraceRecorder, read_trace


def key(i: int, scope: str = "tenant-a") -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1", scope=scope,
                      normalization="n1", canonical=f"text number {i}".encode())


def test_sketch_counts_after_the_doorkeeper_and_ages() -> None:
    s = FrequencySketch(10_000, sample=1000)  # wide: collisions do not blur the counts
    h = hash(key(1))
    assert s.estimate(h) == 0
    s.add(h)
    assert s.estimate(h) == 0  # queued, not counted yet
    s.flush()
    assert s.estimate(h) == 1  # the doorkeeper alone
    s.add_many([h] * 9)
    s.flush()
    assert s.estimate(h) == 10
    assert s.estimate(hash(key(2))) <= 1  # never seen (a collision could add at most this)
    s.age()
    assert s.estimate(h) == 4  # 9 counted, halved; doorkeeper cleared
    for i in range(2000):  # the sample period passes: halved again on the way
        s.add(hash(key(1000 + i)))
    s.flush()
    assert s.estimate(h) <= 2


def test_sketch_counts_repeats_within_one_batch_like_one_by_one() -> None:
    one, many = FrequencySketch(1000), FrequencySketch(1000)
    hashes = [hash(key(i % 7)) for i in range(40)]
    for x in hashes:
        one.add(x)
        one.flush()
    many.add_many(hashes)
    many.flush()
    assert [one.estimate(x) for x in hashes] == [many.estimate(x) for x in hashes]
    assert many.estimate(hashes[0]) == 6  # 6 lookups of key 0: doorkeeper + 5 counted


def test_a_scan_does_not_flush_the_frequent_keys_but_lru_would() -> None:
    now = time.time()
    hits: dict[bool, int] = {}
    for admission in (True, False):
        l1 = MemoryCache(50, 1 << 30, clock=lambda: now, admission=admission)
        hot = [key(i) for i in range(50)]

        def ask(k: CacheKey, l1: MemoryCache = l1) -> bool:
            if l1.get(k) is not None:
                return True
            l1.set(k, Entry(b"v", now, 60.0))
            return False

        for _ in range(3):
            for k in hot:
                ask(k)
        # A scan of 4000 one-off keys; the hot keys are still asked, one per 4 scan keys.
        hits[admission] = 0
        for i in range(4000):
            ask(key(1000 + i))
            if i % 4 == 3:
                hits[admission] += ask(hot[(i // 4) % 50])
        if admission:
            assert l1.stats().rejections > 3000
    assert hits[False] == 0  # LRU: each hot key comes back after 250 others, long gone
    assert hits[True] >= 500  # of 1000 (733 in one run; hash() is salted per process)


def test_a_new_key_asked_more_often_than_the_victim_gets_in() -> None:
    now = time.time()
    l1 = MemoryCache(2, 1 << 30, clock=lambda: now, admission=True)
    for i in (1, 2):
        l1.get(key(i))
        l1.set(key(i), Entry(b"v", now, 60.0))
    for _ in range(3):
        l1.get(key(3))
    assert l1.set(key(3), Entry(b"v", now, 60.0))
    assert l1.get(key(1)) is None and l1.get(key(3)) is not None
    # A refresh of a held key always passes.
    assert l1.set(key(2), Entry(b"w", now, 60.0))


def _count_in_child(path: str, n: int) -> None:
    adm = NodeAdmission.open(path, 8 << 20)
    try:
        for _ in range(n):
            adm.record([key(7)])
    finally:
        adm.close()


def test_node_admission_counts_are_shared_by_processes(tmp_path: Path) -> None:
    path = str(tmp_path)
    mine = NodeAdmission.open(path, 8 << 20)
    try:
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_count_in_child, args=(path, 6)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        # 12 lookups in two other processes: this one sees them (first is the doorkeeper's).
        raw = b"minilm:x:" + key(7).digest
        assert mine.estimate(raw) >= 10
        assert mine.estimate(b"minilm:x:" + key(8).digest) <= 1
    finally:
        mine.close()


def test_recorder_writes_hashes_and_sizes_only_and_stops_at_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "trace.bin"
    now = [1000.0]
    rec = TraceRecorder(str(path), max_bytes=len(MAGIC) + 10 * RECORD.size, max_seconds=60,
                        clock=lambda: now[0])
    secret = "my card is 4111 1111 1111 1111"
    k = derive_key(route="/v1/embeddings", model="minilm", model_version="1", scope="acme",
                   normalization="n1", canonical=secret.encode())
    rec.record([k, key(1)], [None, Entry(b"x" * 1536, now[0], 60.0)])
    rec.record([k], [Entry(b"y" * 100, now[0], 60.0)], kind=1)
    for _ in range(20):
        rec.record([key(2)], [None])
    rec.close()
    data = path.read_bytes()
    assert len(data) == len(MAGIC) + 10 * RECORD.size  # the size bound, to the record
    for needle in (secret.encode(), b"acme", b"4111", b"minilm"):
        assert needle not in data
    got = read_trace(str(path))
    assert len(got) == 9  # 10 records, one of them a store
    assert got[0].size == 100 and got[1].size == 1536  # sizes from the store and the hit
    assert got[0].tenant != got[2].tenant


def test_recorder_stops_after_its_time_bound(tmp_path: Path) -> None:
    path = tmp_path / "trace.bin"
    now = [0.0]
    rec = TraceRecorder(str(path), max_bytes=1 << 20, max_seconds=10, clock=lambda: now[0])
    rec.record([key(1)], [None])
    now[0] = 11.0
    rec.record([key(2)], [None])
    rec.close()
    assert len(read_trace(str(path))) == 1 and not rec.active
