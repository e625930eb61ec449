"""The node tier across real processes: shared entries, writers killed with SIGKILL, the bound.

Children come from a forkserver that has imported the tier but opened nothing (LMDB must not be
used across ``fork``), so each starts in milliseconds. Every child is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest
import xxhash

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.cache.node import NodeCache
from gateway.cache.nodesampled import SampledStore
from gateway.cache.nodestore import GenerationStore, encode_key, pack
from gateway.cache.settings import NodeCacheSettings
from gateway.telemetry.observer import NullObserver

MiB = 1024 * 1024
PROCS = 4
KILL_ROUNDS = 20


class Quiet(NullObserver):
    def cache_bytes(self, tier: str, n: int) -> None:
        pass

    def cache_evictions(self, tier: str, items: int, reason: str = "capacity") -> None:
        pass


def k(text: str) -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1",
                      scope="public", normalization="n1", canonical=text.encode())


def expected(text: str) -> bytes:
    """The value every process stores for ``text``: checkable from the text alone."""
    return xxhash.xxh3_128_digest(text.encode()) * 50


def make_entry(text: str) -> Entry:
    return Entry(expected(text), time.time(), 3600.0, meta=text.encode())


def open_node(path: str, max_bytes: int = 64 * MiB, eviction: str = "sampled") -> NodeCache:
    return NodeCache(NodeCacheSettings(path=path, max_bytes=max_bytes, eviction=eviction),
                     observer=Quiet())


def open_store(path: str, max_bytes: int, eviction: str) -> GenerationStore | SampledStore:
    if eviction == "sampled":
        return SampledStore(path, max_bytes)
    return GenerationStore(path, max_bytes)


def databases(store: GenerationStore | SampledStore) -> tuple[Any, ...]:
    return (store._db,) if isinstance(store, SampledStore) else store._gens


# -- children ------------------------------------------------------------------------------------

def fill_then_read(path: str, me: int, barrier: Barrier, out: Any) -> None:
    """Store this process's texts, wait for every process to have done so, read all of them."""
    async def main() -> None:
        node = open_node(path)
        try:
            barrier.wait(timeout=60)
            mine = [f"text {me}-{i}" for i in range(50)]
            assert await node.store([(k(t), make_entry(t)) for t in mine]) == len(mine)
            barrier.wait(timeout=60)
            texts = [f"text {p}-{i}" for p in range(PROCS) for i in range(50)]
            got = node.lookup([k(t) for t in texts])[0]
            out.put((me, [e is not None and e.value == expected(t)
                          for t, e in zip(texts, got, strict=True)]))
        finally:
            await node.close()

    asyncio.run(main())


def write_until_killed(path: str, seed: int, started: Event, pin: Event, pinned: Event,
                       eviction: str) -> None:
    """Store and read batches of fresh texts until SIGKILL arrives; once ``pin`` is set, hold a
    read transaction open, so the kill also lands "mid-read" and leaves a reader slot behind."""
    async def main() -> None:
        # The smallest map: >= 20 entries per writer per round rotate it several times.
        node = open_node(path, max_bytes=MiB, eviction=eviction)
        rng = random.Random(seed)
        held = None
        for n in range(100_000):  # bounded; the parent kills it long before
            texts = [f"w{seed} {n} {rng.random()}" for _ in range(20)]
            await node.store([(k(t), make_entry(t)) for t in texts])
            node.lookup([k(t) for t in texts[:5]])
            started.set()
            if held is None and pin.is_set():
                held = node._store.env.begin()
                pinned.set()

    asyncio.run(main())


def stream_unique(path: str, me: int, count: int, eviction: str) -> None:
    async def main() -> None:
        node = open_node(path, max_bytes=2 * MiB, eviction=eviction)
        try:
            for start in range(0, count, 50):
                await node.store([(k(f"s{me} {i}"), make_entry(f"s{me} {i}"))
                                  for i in range(start, start + 50)])
        finally:
            await node.close()

    asyncio.run(main())


def hold_open(path: str, opened: Event, release: Event) -> None:
    """Keep the directory open (as a running worker does) until ``release``."""
    store = GenerationStore(path, 16 * MiB)
    opened.set()
    release.wait(timeout=60)
    store.close()


# -- the tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["gateway.cache.node", __name__])
    return ctx


@pytest.fixture
def procs() -> Iterator[list[BaseProcess]]:
    """Children to stop by PID whatever happens."""
    started: list[BaseProcess] = []
    yield started
    for proc in started:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)


def start(ctx: ForkServerContext, procs: list[BaseProcess], target: Any, *args: Any) -> BaseProcess:
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    procs.append(proc)
    return proc


def verify_all(path: str, max_bytes: int, eviction: str = "generations") -> int:
    """Every stored entry decodes and holds the value its text implies; returns the count."""
    store = open_store(path, max_bytes, eviction)
    try:
        count = 0
        with store.env.begin() as txn:
            for db in databases(store):
                for raw, value in txn.cursor(db=db):
                    entry = Entry.decode(value[8:])  # raises CacheCorrupt on any damage
                    text = entry.meta.decode()
                    assert raw == encode_key(k(text)) and entry.value == expected(text)
                    count += 1
        return count
    finally:
        store.close()


def test_a_text_filled_by_one_process_is_a_hit_in_every_other(
        ctx: ForkServerContext, procs: list[BaseProcess], tmp_path: Path) -> None:
    path = str(tmp_path / "node")
    barrier = ctx.Barrier(PROCS)
    out = ctx.Queue()
    for me in range(PROCS):
        start(ctx, procs, fill_then_read, path, me, barrier, out)
    results = dict(out.get(timeout=60) for _ in range(PROCS))
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sorted(results) == list(range(PROCS))
    for me, hits in results.items():
        assert all(hits), f"process {me} missed {hits.count(False)} of {len(hits)} texts"


@pytest.mark.parametrize("eviction", ["sampled", "generations"])
def test_writers_killed_mid_write_leave_a_readable_correct_store(
        ctx: ForkServerContext, procs: list[BaseProcess], tmp_path: Path, eviction: str) -> None:
    path = str(tmp_path / "node")
    survivor = open_store(path, MiB, eviction)  # a worker that lives through every kill
    rng = random.Random(1)
    try:
        for round_ in range(KILL_ROUNDS):
            started, pinned = [ctx.Event() for _ in range(2)], [ctx.Event() for _ in range(2)]
            pin = ctx.Event()
            writers = [start(ctx, procs, write_until_killed, path, round_ * 2 + i, started[i],
                             pin, pinned[i], eviction) for i in range(2)]
            for event in started:
                assert event.wait(timeout=30), "a writer never stored anything"
            time.sleep(rng.uniform(0.0, 0.03))
            pin.set()
            for event in pinned:
                assert event.wait(timeout=30)
            time.sleep(rng.uniform(0.0, 0.01))
            for proc in writers:
                assert proc.pid is not None
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(timeout=10)
                assert proc.exitcode == -signal.SIGKILL
            # The last one killed had nobody left to free its slot (a live writer that fills
            # the map frees dead readers' slots itself); the survivor frees it now.
            assert writers[-1].pid in _reader_pids(survivor)
            assert survivor.reader_check() >= 1
            assert not {p.pid for p in writers} & set(_reader_pids(survivor))
            # The write lock a killed writer may have held is free again, and a write works.
            text = f"after round {round_}"
            raw = encode_key(k(text))
            assert raw is not None
            value = Entry(expected(text), time.time(), 3600.0, meta=text.encode())
            survivor.write([(raw, pack(value.expires_at, value.encode()))], [])
            assert survivor.read([raw])[0][0] == pack(value.expires_at, value.encode())
        if isinstance(survivor, SampledStore):
            # The byte counter and the index of what the kills left agree with the entries.
            with survivor.env.begin() as txn:
                sizes = [len(raw) + len(value) for raw, value in txn.cursor(db=survivor._db)]
                assert txn.stat(survivor._ids)["entries"] == len(sizes)
            assert survivor.data_bytes() == sum(sizes) <= survivor.budget
            assert 0 < len(sizes) < KILL_ROUNDS * 2 * 20, "kills must have hit a store that evicts"
        else:
            assert survivor.rotations() >= 1, "kills must have hit a store that rotates"
    finally:
        survivor.close()
    assert verify_all(path, MiB, eviction) > 0


@pytest.mark.parametrize("eviction", ["sampled", "generations"])
def test_size_stays_bounded_under_unique_texts_from_several_processes(
        ctx: ForkServerContext, procs: list[BaseProcess], tmp_path: Path, eviction: str) -> None:
    path = str(tmp_path / "node")
    writers = [start(ctx, procs, stream_unique, path, me, 1500, eviction) for me in range(3)]
    for proc in writers:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    assert (tmp_path / "node" / "data.mdb").stat().st_size <= 2 * MiB
    store = open_store(path, 2 * MiB, eviction)
    try:
        used, entries = store.used_bytes()
        if isinstance(store, SampledStore):
            assert store.data_bytes() <= store.budget
    finally:
        store.close()
    assert used <= 2 * MiB
    assert 0 < entries < 3 * 1500, "older texts were evicted"
    assert verify_all(path, 2 * MiB, eviction) == entries


def _reader_pids(store: GenerationStore) -> list[int]:
    pids = []
    for line in store.env.readers().splitlines()[1:]:  # "    pid     thread     txnid"
        parts = line.split()
        if parts and parts[0].isdigit():
            pids.append(int(parts[0]))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_directory_in_use_is_never_started_afresh(
        ctx: ForkServerContext, procs: list[BaseProcess], tmp_path: Path) -> None:
    """Lowering max_bytes must not wipe files another running process has mapped."""
    path = str(tmp_path / "node")
    store = GenerationStore(path, 16 * MiB)
    texts = [f"kept {i}" for i in range(2000)]
    for first in range(0, len(texts), 200):
        store.write([(encode_key(k(t)) or b"", pack(time.time() + 60, make_entry(t).encode()))
                     for t in texts[first:first + 200]], [])
    store.close()
    assert (tmp_path / "node" / "data.mdb").stat().st_size > 2 * MiB
    opened, release = ctx.Event(), ctx.Event()
    holder = start(ctx, procs, hold_open, path, opened, release)
    assert opened.wait(timeout=30)
    small = GenerationStore(path, 2 * MiB)  # another process holds it: no wipe
    try:
        assert small.used_bytes()[1] == len(texts)
    finally:
        small.close()
        release.set()
        holder.join(timeout=30)
    assert holder.exitcode == 0
    alone = GenerationStore(path, 2 * MiB)  # alone now: started afresh
    try:
        assert alone.used_bytes()[1] == 0
    finally:
        alone.close()
