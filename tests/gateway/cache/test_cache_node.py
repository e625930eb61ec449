"""The node tier on its own: a real LMDB directory per test (never the default one)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest

from gateway.cache import lmdbenv
from gateway.cache.base import CacheTier
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key, scope_tag
from gateway.cache.node import NodeCache
from gateway.cache.nodesampled import SampledStore
from gateway.cache.nodestore import encode_key, pack
from gateway.cache.settings import NodeCacheSettings, default_node_path
from gateway.telemetry.observer import NullObserver
from gateway.validation import SettingsError

MiB = 1024 * 1024


class Recorder(NullObserver):
    """Counts the node tier's events."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.bytes: dict[str, int] = {}

    def cache_lookups(self, tier: str, result: str, items: int) -> None:
        self.counts[(tier, result)] += items

    def cache_stored(self, tier: str, items: int) -> None:
        self.counts[(tier, "stored")] += items

    def cache_errors(self, tier: str, items: int) -> None:
        self.counts[(tier, "error")] += items

    def cache_evictions(self, tier: str, items: int, reason: str = "capacity") -> None:
        self.counts[(tier, "evicted" if reason == "capacity" else reason)] += items

    def cache_bytes(self, tier: str, n: int) -> None:
        self.bytes[tier] = n


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def k(text: str, model: str = "minilm", scope: str = "tenant-a") -> CacheKey:
    return derive_key(route="/v1/embeddings", model=model, model_version="1", scope=scope,
                      normalization="n1", canonical=text.encode())


def entry(value: bytes, now: float, ttl: float = 3600.0, **kw: Any) -> Entry:
    return Entry(value, now, ttl, **kw)


Factory = Callable[..., NodeCache]


@pytest.fixture
async def open_node(tmp_path: Path) -> AsyncIterator[Factory]:
    """``open_node(**settings)`` -> a NodeCache on ``tmp_path/node`` (closed afterwards)."""
    opened: list[NodeCache] = []

    def make(*, observer: Any = None, clock: Callable[[], float] = time.time,
             **settings: Any) -> NodeCache:
        values: dict[str, Any] = {"path": str(tmp_path / "node")}
        values.update(settings)
        node = NodeCache(NodeCacheSettings(**values), observer=observer or Recorder(),
                         clock=clock)
        opened.append(node)
        return node

    yield make
    for node in opened:
        await node.close()


async def test_set_then_get_round_trips_and_misses_stay_misses(open_node: Factory) -> None:
    rec = Recorder()
    node = open_node(observer=rec)
    assert isinstance(node, CacheTier)
    now = time.time()
    a, b = entry(b"A" * 1536, now, meta=b"m"), entry(b"B", now, stale_if_error_s=60)
    await node.set_many([(k("a"), a), (k("b"), b)])
    got = await node.get_many([k("a"), k("nope"), k("b")])
    assert got == [a, None, b]
    assert rec.counts[("node", "stored")] == 2
    assert 0 < rec.bytes["node"] <= node.stats().max_bytes
    assert node.stats().entries == 2


async def test_entries_expire_and_the_tier_ttl_caps_them(open_node: Factory) -> None:
    clock = Clock()
    node = open_node(clock=clock, ttl_s=100)
    long = entry(b"long", clock.now, ttl=3600)
    short = entry(b"short", clock.now, ttl=10, stale_while_revalidate_s=5)
    await node.set_many([(k("long"), long), (k("short"), short)])
    clock.now += 14.9
    assert await node.get_many([k("long"), k("short")]) == [long, short]  # short: stale, served
    clock.now += 0.2
    assert await node.get_many([k("long"), k("short")]) == [long, None]
    clock.now += 85.0  # 100.1 s after the store: past the tier's own ttl_s
    assert await node.get_many([k("long")]) == [None]
    assert await node.store([(k("gone"), entry(b"x", clock.now - 4000, ttl=10))]) == 0


async def test_purge_by_model_by_scope_and_all(open_node: Factory) -> None:
    node = open_node()
    now = time.time()
    keys = [k(f"t{i}", model=m, scope=s) for i in range(3)
            for m in ("minilm", "minilm:v2", "other") for s in ("tenant-a", "shared")]
    await node.set_many([(key, entry(key.digest, now)) for key in keys])
    assert await node.purge(model="minilm") == 6, "model 'minilm:v2' is a different model"
    left = await node.get_many(keys)
    assert [key for key, e in zip(keys, left, strict=True) if e is not None] == [
        key for key in keys if key.model != "minilm"]
    assert await node.purge(scope="tenant-a") == 6
    assert await node.purge(model="other", scope="shared") == 3
    assert [key for key, e in zip(keys, await node.get_many(keys), strict=True) if e] == [
        key for key in keys if key.model == "minilm:v2" and key.scope == "shared"]
    assert await node.purge() == 3
    assert await node.get_many(keys) == [None] * len(keys)
    assert await node.delete_many([keys[0]]) == 0


async def test_tenant_ids_are_never_stored_in_clear(open_node: Factory, tmp_path: Path) -> None:
    node = open_node()
    await node.set_many([(k("text", scope="tenant-acme-corp"), entry(b"v", time.time()))])
    await node.close()
    data = (tmp_path / "node" / "data.mdb").read_bytes()
    assert b"tenant-acme-corp" not in data
    assert scope_tag("tenant-acme-corp").encode() in data, "the scope tag names it instead"
    assert b"minilm:" in data


async def test_delete_many_counts_what_existed(open_node: Factory) -> None:
    node = open_node()
    now = time.time()
    await node.set_many([(k("a"), entry(b"A", now)), (k("b"), entry(b"B", now))])
    assert await node.delete_many([k("a"), k("zz")]) == 1
    assert await node.get_many([k("a"), k("b")]) == [None, entry(b"B", now)]


@pytest.mark.parametrize("eviction", ["sampled", "generations"])
async def test_corrupt_values_are_misses_and_counted(open_node: Factory, eviction: str) -> None:
    rec = Recorder()
    node = open_node(observer=rec, eviction=eviction)
    now = time.time()
    good = entry(b"good", now)
    await node.set_many([(k("good"), good)])
    blob = bytearray(good.encode())
    blob[-1] ^= 0xFF  # one flipped bit in the value: the checksum no longer matches
    store = node._store
    with store.env.begin(write=True) as txn:
        cur = store._db if isinstance(store, SampledStore) else store._roles(txn)[0]
        for name, value in (("flipped", pack(now + 60, bytes(blob))), ("short", b"\x01\x02"),
                            ("garbage", pack(now + 60, b"not an entry at all"))):
            raw = encode_key(k(name))
            assert raw is not None
            txn.put(raw, value, db=cur)
    got = await node.get_many([k("flipped"), k("short"), k("garbage"), k("good")])
    assert got == [None, None, None, good]
    assert rec.counts[("node", "error")] == 2, "the short value has no deadline: just a miss"


async def write_through(node: NodeCache, tmp_path: Path, bounded: Callable[[Any], bool]) -> int:
    """3,000 entries of ~1.7 KB (about 5 MB) written through a 2 MiB tier in batches of 100,
    ``bounded(node.stats())`` and the file's size checked after each; returns the count."""
    now = time.time()
    total = 3000
    for start in range(0, total, 100):
        await node.set_many([(k(f"unique {i}"), entry(i.to_bytes(4, "big") * 400, now))
                             for i in range(start, start + 100)])
        assert bounded(node.stats())
        assert (tmp_path / "node" / "data.mdb").stat().st_size <= 2 * MiB
    return total


async def test_rotation_keeps_the_byte_bound_and_counts_evictions(
        open_node: Factory, tmp_path: Path) -> None:
    rec = Recorder()
    # Admission off: it would keep these never-read keys out once the tier is full.
    node = open_node(observer=rec, max_bytes=2 * MiB, admission=False, eviction="generations")
    total = await write_through(node, tmp_path, lambda stats: stats.bytes <= 2 * MiB)
    evicted = rec.counts[("node", "evicted")]
    kept = node.stats().entries
    assert evicted > 0 and kept > 0
    assert evicted + kept == total, "every entry written is either kept or counted evicted"
    latest = await node.get_many([k(f"unique {i}") for i in range(total - 100, total)])
    assert all(e is not None and e.value == i.to_bytes(4, "big") * 400
               for i, e in zip(range(total - 100, total), latest, strict=True))
    assert await node.get_many([k("unique 0")]) == [None]
    assert rec.bytes["node"] == node.stats().bytes


async def test_sampled_eviction_keeps_the_byte_bound_and_counts_evictions(
        open_node: Factory, tmp_path: Path) -> None:
    rec = Recorder()
    node = open_node(observer=rec, max_bytes=2 * MiB, admission=False)  # sampled: the default
    store = node._store
    assert isinstance(store, SampledStore)
    total = await write_through(node, tmp_path, lambda stats: (
        stats.bytes <= store.page_bound and store.data_bytes() <= store.budget))
    evicted = rec.counts[("node", "evicted")]
    kept = node.stats().entries
    assert evicted > 0 and kept > 0
    # Without admission no write is turned away: a draw that lands on an entry the same
    # transaction wrote is drawn again (before, 9 runs in 25 lost a few writes that way).
    rejected = rec.counts[("node", "rejected")]
    assert evicted + kept + rejected == total, "every entry written is kept or counted out"
    assert rejected == 0, f"{rejected} writes found no room"
    got = await node.get_many([k(f"unique {i}") for i in range(total)])
    assert sum(e is not None for e in got) == kept
    assert rec.bytes["node"] == node.stats().bytes


async def test_a_hit_in_the_previous_generation_moves_into_the_current(
        open_node: Factory) -> None:
    node = open_node(eviction="generations")
    now = time.time()
    keep, lose = entry(b"read again", now), entry(b"never read", now)
    await node.set_many([(k("keep"), keep), (k("lose"), lose)])
    node._store.rotate()  # both now in the previous generation
    assert await node.get_many([k("keep")]) == [keep]
    await node.flush()  # the move is a background write
    node._store.rotate()  # empties the generation "lose" is still in
    assert await node.get_many([k("keep"), k("lose")]) == [keep, None]


async def test_a_batch_that_cannot_fit_is_dropped_not_raised(open_node: Factory) -> None:
    rec = Recorder()
    node = open_node(observer=rec, max_bytes=MiB, admission=False)
    now = time.time()
    huge = [(k(f"big {i}"), entry(bytes(64 * 1024), now)) for i in range(32)]  # 2 MiB at once
    assert await node.store(huge) == 0
    assert rec.counts[("node", "error")] == 32
    small = entry(b"fits", now)
    assert await node.store([(k("small"), small)]) == 1
    assert await node.get_many([k("small")]) == [small]


async def test_a_full_map_rotates_and_a_pinned_snapshot_only_drops_writes(
        open_node: Factory) -> None:
    """A reader holding an old snapshot (a process stopped mid-read) keeps freed pages from
    being reused: writes then fail as dropped writes, never as errors to the caller, and work
    again once it lets go."""
    rec = Recorder()
    node = open_node(observer=rec, max_bytes=MiB, admission=False)
    now = time.time()
    batch = 0

    async def store() -> int:
        nonlocal batch
        batch += 1
        return await node.store([(k(f"b{batch} {i}"), entry(bytes(1500), now))
                                 for i in range(50)])

    pinned = node._store.env.begin()
    stored = [await store() for _ in range(20)]  # ~1.7 MB through a 1 MiB map
    assert 0 in stored and rec.counts[("node", "error")] > 0
    pinned.abort()
    assert [await store() for _ in range(20)] == [50] * 20
    assert rec.counts[("node", "evicted")] > 0


async def test_entries_survive_close_and_reopen(open_node: Factory) -> None:
    now = time.time()
    first = open_node()
    await first.set_many([(k(f"t{i}"), entry(bytes([i]) * 100, now)) for i in range(50)])
    await first.close()
    again = open_node()
    got = await again.get_many([k(f"t{i}") for i in range(50)])
    assert got == [entry(bytes([i]) * 100, now) for i in range(50)]


async def test_a_directory_from_before_a_host_restart_starts_empty(
        open_node: Factory, tmp_path: Path) -> None:
    """Commits skip fsync, so a file written under another boot may be torn: never read it."""
    now = time.time()
    first = open_node()
    await first.set_many([(k("a"), entry(b"A", now))])
    await first.close()
    mark = tmp_path / "node" / "boot_id"
    assert mark.read_text() == lmdbenv.boot_id()
    again = open_node()
    assert await again.get_many([k("a")]) == [entry(b"A", now)], "same boot: kept"
    await again.close()
    mark.write_text("a-boot-before-a-crash")
    after = open_node()
    assert await after.get_many([k("a")]) == [None]
    assert mark.read_text() == lmdbenv.boot_id()
    assert after._store.env.flags()["sync"] is False


async def test_max_bytes_lowered_starts_the_directory_afresh_and_it_keeps_working(
        open_node: Factory, tmp_path: Path) -> None:
    """LMDB never shrinks its file; a map smaller than the data could not even rotate."""
    now = time.time()
    big = open_node(max_bytes=16 * MiB)
    for start in range(0, 2000, 200):
        await big.set_many([(k(f"t{i}"), entry(bytes(1500), now))
                            for i in range(start, start + 200)])
    await big.close()
    data = tmp_path / "node" / "data.mdb"
    assert data.stat().st_size > 2 * MiB
    small = open_node(max_bytes=2 * MiB)
    assert await small.get_many([k("t0")]) == [None]
    for start in range(0, 3000, 200):
        assert await small.store([(k(f"u{i}"), entry(bytes(1500), now))
                                  for i in range(start, start + 200)]) == 200
    assert data.stat().st_size <= 2 * MiB


async def test_without_a_boot_id_commits_fsync(open_node: Factory,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdbenv, "BOOT_ID", Path("/nonexistent/boot_id"))
    node = open_node()
    assert node._store.env.flags()["sync"] is True
    await node.set_many([(k("a"), entry(b"A", time.time()))])
    assert (await node.get_many([k("a")]))[0] is not None


async def test_close_waits_for_queued_writes(open_node: Factory) -> None:
    now = time.time()
    node = open_node()
    node._submit("write", ([(encode_key(k("queued")), pack(now + 60, entry(b"q", now).encode()))],
                           []), 1)
    await node.close()
    assert await open_node().get_many([k("queued")]) == [entry(b"q", now)]


async def test_a_closed_tier_answers_misses_and_drops_writes(open_node: Factory) -> None:
    node = open_node()
    await node.close()
    assert node.lookup([k("a")]) == ([None], False)
    assert await node.store([(k("a"), entry(b"A", time.time()))]) == 0


def test_one_directory_opens_once_per_process(tmp_path: Path) -> None:
    """LMDB must not be opened twice by one process: two tiers on a path share one env."""
    settings = NodeCacheSettings(path=str(tmp_path / "shared"))
    a = NodeCache(settings, observer=Recorder())
    b = NodeCache(settings, observer=Recorder())
    assert a._store.env is b._store.env
    a._store.close()
    with a._store.env.begin() as txn:  # still open for b
        assert txn.stat()["entries"] >= 0
    b._store.close()
    with pytest.raises(lmdb.Error):
        b._store.env.begin()
    a._writer.shutdown()
    b._writer.shutdown()


@pytest.mark.parametrize(("field", "value"), [
    ("enabled", "yes"), ("path", ""), ("path", "  "), ("max_bytes", 1024), ("max_bytes", 2.5),
    ("max_bytes", True), ("ttl_s", 0), ("ttl_s", float("inf")), ("ttl_s", "1d"),
])
def test_settings_name_the_bad_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        NodeCacheSettings(**{field: value})


def test_default_node_path_is_per_deployment(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_node_path() == str(tmp_path / "edge-gateway" / "node")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    root = Path.home() / ".cache" / "edge-gateway" / "node"
    assert default_node_path() == str(root)
    assert NodeCacheSettings().path is None
    assert NodeCacheSettings().directory("0123abcd") == str(root / "0123abcd")
    assert NodeCacheSettings(path="/srv/node").directory("0123abcd") == "/srv/node"


def recorded_submits(node: NodeCache) -> list[object]:
    """What the node hands its writer thread, in order (each a drain: one or more
    transactions of what was queued when it ran)."""
    started: list[object] = []
    submit = node._writer.submit

    def recording(fn: Any, *args: Any) -> Any:
        started.append(fn)
        return submit(fn, *args)

    node._writer.submit = recording  # type: ignore[method-assign]
    return started


async def test_without_a_write_delay_a_background_write_wakes_the_writer_on_the_next_loop_turn(
    open_node: Factory,
) -> None:
    """The writer thread shares the core with the loop: woken at once, it would run its
    transaction ahead of the answer the loop is about to send. ``store_nowait`` queues the
    write at once (``flush`` and later writes see it) and, with ``write_delay_ms: 0``, starts
    the writer a turn later."""
    rec = Recorder()
    node = open_node(observer=rec, write_delay_ms=0)
    started = recorded_submits(node)
    now = time.time()
    a = entry(b"A", now)
    node.store_nowait([(k("a"), a)])
    node.store_nowait([(k("b"), entry(b"B", now))])  # joins the queued job: one wake-up
    assert started == []  # nothing runs before this step of the loop ends
    await asyncio.sleep(0)
    assert len(started) == 1
    await node.flush()
    assert await node.get_many([k("a")]) == [a]
    assert rec.counts[("node", "stored")] == 2


async def test_background_writes_within_the_write_delay_share_one_transaction(
    open_node: Factory,
) -> None:
    """A background write starts the writer ``write_delay_ms`` later; the writes of the
    misses that come meanwhile join it: one drain, one transaction. ``flush`` and an awaited
    job do not wait for the delay. (Bounds, not timings: a delay far longer than the test's
    waits, so a slow machine cannot make the timer fire early or the test pass late.)"""
    rec = Recorder()
    node = open_node(observer=rec, write_delay_ms=500)
    started = recorded_submits(node)
    writes: list[int] = []
    write = node._store.write

    def counting(puts: Any, *args: Any, **kw: Any) -> Any:
        writes.append(len(puts))
        return write(puts, *args, **kw)

    node._store.write = counting  # type: ignore[method-assign]
    now = time.time()
    for name in "abc":
        node.store_nowait([(k(name), entry(name.encode(), now))])
        await asyncio.sleep(0)  # a turn of the loop: a miss's write would start on it
    assert started == [] and writes == []  # within the delay: nothing ran yet
    for _ in range(1000):  # bounded: 10 s against a delay of 0.5 s
        await asyncio.sleep(0.01)
        if writes:
            break
    assert len(started) == 1 and writes == [3]  # one drain, one transaction of three
    await node.flush()
    assert rec.counts[("node", "stored")] == 3
    # flush() starts a waiting drain at once: a 60 s delay would outlast the bound.
    slow = open_node(observer=Recorder(), path=str(Path(node.path).parent / "slow"))
    slow._write_delay_s = 60.0
    slow.store_nowait([(k("d"), entry(b"D", now))])
    await asyncio.wait_for(slow.flush(), timeout=20)
    assert await slow.get_many([k("d")]) != [None]
    # So does a job someone awaits (a delete), queued behind a waiting background write.
    slow.store_nowait([(k("e"), entry(b"E", now))])
    assert await asyncio.wait_for(slow.delete_many([k("d")]), timeout=20) == 1
    await asyncio.wait_for(slow.flush(), timeout=20)
    assert await slow.get_many([k("d"), k("e")]) == [None, entry(b"E", now)]


def test_the_write_delay_is_checked() -> None:
    assert NodeCacheSettings().write_delay_ms == 20.0
    for bad in (-1, 1001, "5", True):
        with pytest.raises(SettingsError, match="write_delay_ms"):
            NodeCacheSettings(write_delay_ms=bad)  # type: ignore[arg-type]


async def test_a_background_write_is_counted_at_the_metrics_flush_without_waking_the_loop(
    open_node: Factory,
) -> None:
    """The writer thread does not wake the loop once per write (a turn of the loop per miss):
    what it did waits until the next metrics flush (the hook ``on_flush`` registers) or a
    ``flush()``, which then counts it exactly; a closed tier takes its hook back."""
    hooks: list[Any] = []

    class Hooked(Recorder):
        def on_flush(self, collect: Any) -> Any:
            hooks.append(collect)
            return lambda: hooks.remove(collect)

    rec = Hooked()
    node = open_node(observer=rec)
    assert len(hooks) == 1
    loop = asyncio.get_running_loop()
    woken: list[object] = []
    original = loop.call_soon_threadsafe

    def recording(callback: Any, *args: Any, **kw: Any) -> Any:
        woken.append(callback)
        return original(callback, *args, **kw)

    loop.call_soon_threadsafe = recording  # type: ignore[method-assign]
    try:
        now = time.time()
        node.store_nowait([(k("a"), entry(b"A", now)), (k("b"), entry(b"B", now))])
        for _ in range(500):  # the write lands on disk; nothing tells the loop
            await asyncio.sleep(0.01)
            if await node.get_many([k("b")]) != [None]:
                break
        await asyncio.sleep(0.05)  # the writer's report is in by now
        assert rec.counts[("node", "stored")] == 0 and not woken
        hooks[0]()  # the metrics flush
        assert rec.counts[("node", "stored")] == 2 and rec.bytes["node"] > 0
        hooks[0]()  # nothing twice
        assert rec.counts[("node", "stored")] == 2
        # With a flush() waiting, the writer wakes the loop for it.
        node.store_nowait([(k("c"), entry(b"C", now))])
        await asyncio.wait_for(node.flush(), timeout=5)
        assert rec.counts[("node", "stored")] == 3
        assert woken == [node._collect] or (not woken and node._unreported == 0)
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
    await node.close()
    assert hooks == []


async def test_a_failing_reader_check_does_not_stop_the_writer(
    open_node: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer frees dead readers' slots now and then; if that check raises, the writes
    queued with it still run, and so do later ones (raised out of the drain, it would leave
    the queue marked as draining and no write would run again)."""
    rec = Recorder()
    node = open_node(observer=rec)

    def broken() -> int:
        raise lmdb.ReadersFullError("reader table full")

    monkeypatch.setattr(node._store, "reader_check", broken)
    node._last_reader_check = 0.0  # due now
    now = time.time()
    a = entry(b"A", now)
    node.store_nowait([(k("a"), a)])
    await asyncio.wait_for(node.flush(), timeout=5)
    node._last_reader_check = 0.0
    node.store_nowait([(k("b"), entry(b"B", now))])
    await asyncio.wait_for(node.flush(), timeout=5)
    assert await node.get_many([k("a"), k("b")]) != [None, None]
    assert rec.counts[("node", "stored")] == 2


async def test_a_background_write_whose_writer_is_gone_fails_as_a_write_and_flush_returns(
    open_node: Factory,
) -> None:
    rec = Recorder()
    node = open_node(observer=rec)
    node.store_nowait([(k("a"), entry(b"A", time.time()))])  # its writer starts next turn
    node._writer.shutdown()  # gone before that turn
    await asyncio.wait_for(node.flush(), timeout=5)  # not left waiting for a writer
    assert rec.counts[("node", "error")] == 1
    assert await node.get_many([k("a")]) == [None]
