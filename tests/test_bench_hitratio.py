"""bench hitratio: the yardsticks on traces with answers known by hand, and the replays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import hitoptimal, hitratio, hitrecord, hitreplay, hittraces
from bench.__main__ import main as bench_main
from gateway.cache.entry import Entry
from gateway.cache.tracefile import STORE, TraceRecorder


def test_belady_lru_and_oracle_on_a_trace_worked_by_hand() -> None:
    keys = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 4])
    # LRU, 2 entries: every request misses (each key comes back after two others).
    assert hitoptimal.lru(keys, 2).tolist() == [False] * 10
    # MIN, 2 entries: keeps 1 and 2 (asked again soonest): hits at 3, 4, 6, 7.
    assert np.flatnonzero(hitoptimal.belady(keys, 2)).tolist() == [3, 4, 6, 7]
    # Oracle, 2 entries: 1 and 2 (three requests each); first requests still miss.
    assert np.flatnonzero(hitoptimal.oracle(keys, 2)).tolist() == [3, 4, 6, 7]
    # 3 entries: LRU keeps 1, 2 and one of 3/4; MIN is never below LRU.
    assert hitoptimal.belady(keys, 3).sum() >= hitoptimal.lru(keys, 3).sum()


def test_belady_by_bytes_skips_what_does_not_fit() -> None:
    keys = np.array([1, 2, 1, 2, 1])
    sizes = np.array([10, 100, 10, 100, 10])
    hits = hitoptimal.belady(keys, 50, sizes=sizes)
    assert hits.tolist() == [False, False, True, False, True]
    assert hitoptimal.lru(keys, 50, sizes=sizes).tolist() == hits.tolist()


def test_the_real_l1_without_admission_is_exactly_lru() -> None:
    trace = hittraces.synthetic(quick=True)[3]  # zipf-0.8
    keys = hitreplay.cache_keys(trace.keys, trace.tenants)
    for cap in (40, 400):
        real = hitreplay.replay_l1(keys, trace.sizes, max_entries=cap, max_bytes=1 << 50,
                                   admission=False)
        assert (real == hitoptimal.lru(trace.keys, cap)).all()


def test_admission_beats_lru_on_zipf_with_scans() -> None:
    trace = next(t for t in hittraces.synthetic(quick=True) if t.name == "zipf-0.8+scan50")
    keys = hitreplay.cache_keys(trace.keys, trace.tenants)
    cap = 200
    lru = hitreplay.replay_l1(keys, trace.sizes, max_entries=cap, max_bytes=1 << 50,
                              admission=False).mean()
    tlfu = hitreplay.replay_l1(keys, trace.sizes, max_entries=cap, max_bytes=1 << 50,
                               admission=True).mean()
    oracle = hitoptimal.oracle(trace.keys, cap).mean()
    assert lru < tlfu <= hitoptimal.belady(trace.keys, cap).mean()
    assert tlfu > 0.6 * oracle


def test_node_tier_replay_holds_about_its_bound() -> None:
    keys = np.arange(3000, dtype=np.int64)
    ck = hitreplay.cache_keys(np.concatenate([keys, keys]), np.zeros(6000, dtype=np.int8))
    hits, peak = hitreplay.replay_node(ck, np.full(6000, 1536), max_bytes=1 << 20,
                                       admission=False)
    assert 100 < peak < 3000  # a 1 MiB map holds a few hundred 1.5 KB entries at most
    assert hits[:3000].sum() == 0


def test_hitratio_quick_runs(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    assert bench_main(["hitratio", "--quick", "--svg", f"{tmp_path}/h.svg"]) == 0
    out = capsys.readouterr().out
    assert "| zipf-0.8 | 5% |" in out and "L1+tlfu / oracle" in out
    # One tenant's scan against the other tenants, for both tiers (the node tier at 5% only).
    assert "| 5% | L1 |" in out and "| 5% | node |" in out and "| 1% | node |" not in out


def test_a_recorded_trace_file_replays_in_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A file as the gateway writes it: Zipf-like lookups of two tenants, each key stored once.
    path = tmp_path / "trace.bin"
    rec = TraceRecorder(str(path), max_bytes=1 << 20, max_seconds=60, clock=lambda: 1000.0)
    ids = hitrecord.texts_for(600, 100, 0.8, 0.1)
    assert sum(map(len, ids)) == 540 + 60 * hitrecord.LIST_TEXTS
    assert len({k for req in ids for k in req if k >= 100}) > 30  # one-off texts, above 100
    stored: set[int] = set()
    for req in ids:
        keys = [hitreplay.cache_keys(np.array([k]), np.array([k % 2], dtype=np.int8))[0]
                for k in req]
        rec.record(keys, [Entry(b"x" * 1536, 1000.0, 60.0) if k in stored else None
                          for k in req])
        fresh = [key for k, key in zip(req, keys, strict=True) if k not in stored]
        rec.record(fresh, [Entry(b"x" * 1536, 1000.0, 60.0)] * len(fresh), kind=STORE)
        stored.update(req)
    rec.close()
    trace = hittraces.recorded(str(path))
    assert len(trace.keys) == sum(map(len, ids)) and set(trace.tenants.tolist()) == {0, 1}
    assert trace.universe == len(stored) and (trace.sizes == 1536).all()
    rows = hitratio.run_trace(trace, (0.05,), (), 1.0)
    hitratio.targets(rows)
    out = capsys.readouterr().out
    assert f"| recorded:trace.bin | 5% | {float(rows[0]['l1']) / float(rows[0]['oracle']):.2f}" \
        in out
    # What the oracle holds is what an L1 of that many entries can reach at most, roughly.
    assert 0 < float(rows[0]["lru"]) <= float(rows[0]["belady"])
    assert float(rows[0]["l1+tlfu"]) <= float(rows[0]["belady"])


def test_sampled_node_tier_holds_the_entries_its_map_was_sized_for() -> None:
    from bench.hitratio import UNIFORM, node_map

    keys = np.arange(3000, dtype=np.int64)
    ck = hitreplay.cache_keys(np.concatenate([keys, keys]), np.zeros(6000, dtype=np.int8))
    hits, peak = hitreplay.replay_node(ck, np.full(6000, UNIFORM),
                                       max_bytes=node_map(500, 1.0, "sampled"),
                                       admission=False, eviction="sampled")
    assert 490 <= peak <= 500  # the budget holds the capacity asked for, never more
    assert hits[:3000].sum() == 0
    assert 0 < hits[3000:].sum() < 3000
