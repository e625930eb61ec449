"""The node tier: one cache shared by every worker process of a gateway on a host.

It sits between each worker's small in-process L1 and Redis (L2). Embedded (nothing to run):
an LMDB environment in a directory (``cache.node.eviction``: ``nodesampled.py``, one database
with sampled eviction, the default; or ``nodestore.py``, two rotating generations), so
it is memory-mapped, bounded in bytes, safe under concurrent readers and writers across
processes, left intact by a worker killed mid-write, and still there after a restart.

Event loop: a lookup reads the memory map inline. Measured on the reference machine with
1.5 KB embedding entries: about 6 us for one key (read transaction 1.3 us, key and get about
1 us, checking and decoding the entry 2-3 us) and 60 us for 16; handing the call to a thread
and back (``run_in_executor``) alone costs 36 us, and a read never waits for a writer. Writes
(stores, moves out of the previous generation, deletes, purges) go to one writer thread, off
the loop: they wait for the cross-process write lock, and calls queued meanwhile are written
together in one transaction (commits skip fsync: ``lmdbenv.py`` says why that is safe).
``flush()`` and ``close()`` wait for every queued write.

Request-path operations never raise: an LMDB error is a miss or a dropped write, counted as a
``node`` tier error. A full map (``MapFullError``) frees room (rotates the generations, or
evicts an eighth of the entries, sampled) and retries.
Stale reader slots of dead processes are cleared at open and every ``READER_CHECK_S``
(nodewriter.py, which holds the write queue and the writer thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb

from gateway.cache.base import CacheUnavailable
from gateway.cache.deployment import Deployment
from gateway.cache.entry import CacheCorrupt, Entry
from gateway.cache.keys import CacheKey
from gateway.cache.nodeadmit import NodeAdmission
from gateway.cache.nodesampled import SampledStore
from gateway.cache.nodestore import (
    GenerationStore,
    KeyBytes,
    WriteResult,
    encode_key,
    node_tag,
    pack,
    unpack_deadline,
)
from gateway.cache.nodewriter import Background, NodeWriter, WriterThread, _Job
from gateway.cache.settings import NodeCacheSettings
from gateway.telemetry.observer import NullObserver, Observer

log = logging.getLogger(__name__)


def open_node_cache(settings: NodeCacheSettings, *, deployment: Deployment | None = None,
                    model_identity: Callable[[str], str] | None = None,
                    observer: Observer | None = None,
                    clock: Callable[[], float] = time.time) -> NodeCache | None:
    """The node tier as ``settings`` ask, scoped to ``deployment`` and each model's identity
    (gateway/cache/deployment.py), or ``None`` when it is off or cannot be opened (a
    directory that cannot be created or written, or files that are not LMDB's): the gateway
    then serves with its other tiers and says why once, at start-up."""
    if not settings.enabled:
        return None
    path = settings.directory(deployment.tag if deployment is not None else "default")
    try:
        cache = NodeCache(settings, path=path, observer=observer, clock=clock,
                          namespace=deployment.namespace if deployment is not None else "",
                          model_identity=model_identity)
    except (lmdb.Error, OSError) as exc:
        log.warning("node cache disabled: cannot open %s (%s: %s); set cache.node.path to a "
                    "writable directory, or remove it if its files are damaged",
                    path, type(exc).__name__, exc)
        return None
    if deployment is not None:
        log.info("node cache at %s, scoped to deployment %s (from %s)", path, deployment.tag,
                 "cache.node.deployment" if deployment.source == "settings"
                 else "the tenants file")
    return cache


@dataclass(frozen=True, slots=True)
class NodeStats:
    """A snapshot of the node tier: pages in use (bytes) and entries, both generations."""

    bytes: int
    entries: int
    max_bytes: int


class NodeCache(NodeWriter):
    """The node tier (see the module docstring). ``name`` is ``"node"``."""

    name = "node"

    def __init__(self, settings: NodeCacheSettings, *, path: str | None = None,
                 namespace: str = "", model_identity: Callable[[str], str] | None = None,
                 observer: Observer | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``path``: the directory (default: ``settings.directory("default")``);
        ``namespace`` and ``model_identity`` scope the keys (``nodestore.encode_key``)."""
        self.settings = settings
        self.clock = clock
        self.path = path if path is not None else settings.directory("default")
        self._namespace = namespace
        self._identity = model_identity
        self._observer: Observer = observer or NullObserver()
        self._store: GenerationStore | SampledStore = (
            SampledStore(self.path, settings.max_bytes, clock=clock)
            if settings.eviction == "sampled" else GenerationStore(self.path, settings.max_bytes))
        try:
            self._admit = (NodeAdmission.open(self.path, self._store.map_size)
                           if settings.admission else None)
        except BaseException:
            self._store.close()
            raise
        self._writer = WriterThread("node-cache-writer")
        self._lock = threading.Lock()  # guards the queue between the loop and the writer
        self._queue: list[_Job] = []
        self._queued_items = 0
        self._draining = False
        self._write_delay_s = settings.write_delay_ms / 1000.0
        self._timer: asyncio.TimerHandle | None = None  # a delayed drain (on the loop)
        self._pending: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # where unawaited writes report
        self._unreported = 0  # unawaited writes queued whose report has not reached the loop
        self._idle: list[asyncio.Future[None]] = []  # flush() callers waiting for those
        # What the writer thread did for unawaited writes, not yet counted on the loop
        # (under _lock): writes, stored, evicted, rejected, failed, bytes after (-1: none).
        self._done: list[int] = [0, 0, 0, 0, 0, -1]
        self._wake_on_write = False  # a flush() waits: the writer wakes the loop (under _lock)
        self._last_reader_check = time.monotonic()
        self._closed = False
        self._observer.cache_bytes("node", self._store.used_bytes()[0])  # warm from a restart
        self._no_collect = self._observer.on_flush(self._collect)

    def stats(self) -> NodeStats:
        used, entries = self._store.used_bytes()
        return NodeStats(used, entries, self._store.map_size)

    # -- lookups (inline on the loop) ----------------------------------------------------------

    def lookup(self, keys: Sequence[CacheKey]) -> tuple[list[Entry | None], bool]:
        """Entries (fresh or stale; ``None`` past the tier's deadline) and whether the tier
        answered. Hits in the previous generation are queued to move into the current one."""
        if self._closed:
            return [None] * len(keys), False
        if self._admit is not None:
            self._admit.record(keys)
        try:
            values, old = self._store.read(self._encode(keys))
        except lmdb.Error as exc:
            log.warning("node cache read failed: %s", type(exc).__name__)
            self._observer.cache_errors("node", len(keys))
            return [None] * len(keys), False
        now = self.clock()
        out: list[Entry | None] = []
        corrupt = 0
        for value in values:
            if value is None or not unpack_deadline(value) > now:
                out.append(None)
                continue
            try:
                out.append(Entry.decode(value[8:]))
            except CacheCorrupt:
                corrupt += 1
                out.append(None)
        if corrupt:
            log.warning("node cache held %d corrupt entries; treated as misses", corrupt)
            self._observer.cache_errors("node", corrupt)
        if old:
            self._submit("write", ([], old), len(old))
        return out, True

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Entry | None]:
        return self.lookup(keys)[0]

    def _encode(self, keys: Sequence[CacheKey]) -> list[KeyBytes | None]:
        """The LMDB keys, in this deployment's namespace and each model's identity."""
        if self._identity is None:
            return [encode_key(k, self._namespace) for k in keys]
        identities: dict[str, str] = {}
        out: list[KeyBytes | None] = []
        for k in keys:
            found = identities.get(k.model)
            if found is None:
                found = identities[k.model] = self._identity(k.model)
            out.append(encode_key(k, self._namespace, found))
        return out

    # -- writes (the writer thread) ------------------------------------------------------------

    async def store(self, items: Sequence[tuple[CacheKey, Entry]]) -> int:
        """Like ``set_many``; returns how many entries were written (0 when dropped)."""
        puts = self._puts(items)
        if not puts:
            return 0
        result = await self._run("write", (puts, []), len(puts))
        return result[0].stored if result is not None else 0

    async def set_many(self, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        await self.store(items)

    def store_nowait(self, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        """Like ``store``, queued and not awaited (``flush()`` waits for it): no task and no
        future per call; the writer thread reports the counts once per transaction."""
        puts = self._puts(items)
        if puts:
            self._submit("write", (puts, []), len(puts))

    def _puts(self, items: Sequence[tuple[CacheKey, Entry]]) -> list[tuple[KeyBytes, bytes]]:
        """The records to write: each entry under its encoded key, expiring at the earlier of
        its own end and the tier's ``ttl_s``; entries already past it are left out."""
        now = self.clock()
        cap = now + self.settings.ttl_s
        puts: list[tuple[KeyBytes, bytes]] = []
        raws = self._encode([key for key, _ in items])
        for (_key, entry), raw in zip(items, raws, strict=True):
            deadline = min(entry.expires_at, cap)
            if raw is not None and deadline > now:
                puts.append((raw, pack(deadline, entry.encode())))
        return puts

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        raws = [raw for raw in self._encode(keys) if raw is not None]
        if not raws:
            return 0
        result = await self._run("delete", raws, len(raws))
        return result[1] if result is not None else 0

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        """Remove every entry of ``model`` and/or ``scope``; raises ``CacheUnavailable`` when
        it could not be done (an admin must never believe a purge happened when it did not)."""
        tag = None if scope is None else node_tag(self._namespace, scope)
        try:
            fut = self._enqueue("purge", (model, tag), 0)
            removed, used = await asyncio.wrap_future(fut)
        except Exception as exc:
            raise CacheUnavailable(f"node cache purge failed: {type(exc).__name__}") from exc
        self._observer.cache_bytes("node", used)
        return int(removed)

    async def flush(self) -> None:
        """Wait for every write queued so far (and count what the unawaited ones did)."""
        self._drain_now()  # not after the write delay
        while self._pending or self._unreported:
            if self._pending:
                await asyncio.gather(*list(self._pending), return_exceptions=True)
            if self._unreported:
                with self._lock:  # from now on the writer wakes the loop after each write
                    self._wake_on_write = True
                self._collect()
                if self._unreported:
                    idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._idle.append(idle)
                    await idle
        with self._lock:
            self._wake_on_write = False

    async def close(self) -> None:
        """Wait for queued writes, stop the writer thread and release the directory."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        self._no_collect()
        await asyncio.get_running_loop().run_in_executor(None, self._writer.shutdown)
        if self._admit is not None:
            self._admit.close()
        self._store.close()

    def _submit(self, op: str, args: Any, items: int) -> None:
        """Queue a write nobody awaits (counted in ``_unreported`` for ``flush``)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        try:
            self._put(op, args, items, None, later=self._loop)
        except RuntimeError:  # closed, or the queue is full
            self._observer.cache_errors("node", items)
            return
        self._unreported += 1

    def _wrote(self, report: Background) -> None:
        """Writer thread: add the outcome of unawaited writes to what the loop collects at
        the next metrics flush (``_collect``); the loop is woken for it only while a
        ``flush()`` waits, not once per write (a wake-up per miss cost the loop a turn)."""
        writes, done, failed, exc = report
        if exc is not None:
            if isinstance(exc, lmdb.Error):
                log.warning("node cache write failed: %s", type(exc).__name__)
            else:  # not the store's trouble: more likely a bug, so make it visible
                log.error("node cache write raised unexpected %s", type(exc).__name__,
                          exc_info=exc)
        with self._lock:
            acc = self._done
            acc[0] += writes
            acc[4] += failed if exc is not None else 0
            if done is not None:
                acc[1] += done.stored
                acc[2] += done.evicted
                acc[3] += done.rejected
                acc[5] = done.bytes
            wake = self._wake_on_write
        loop = self._loop
        if wake and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._collect)

    def _collect(self) -> None:
        """On the loop: count what the writer thread did for unawaited writes since the last
        collection, as ``_run`` counts an awaited one, and release ``flush()`` waiters once
        every queued write is done."""
        with self._lock:
            acc = self._done
            if not acc[0]:
                return
            self._done = [0, 0, 0, 0, 0, -1]
        writes, stored, evicted, rejected, failed, used = acc
        self._unreported -= writes
        if failed:
            self._observer.cache_errors("node", failed)
        if used >= 0:  # a transaction went through: counted as ``_run`` counts one
            self._report(WriteResult(stored, evicted, 0, used, rejected))
        if self._unreported <= 0:
            self._unreported = 0
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)

    def _report(self, done: WriteResult) -> None:
        self._observer.cache_stored("node", done.stored)
        self._observer.cache_evictions("node", done.evicted)
        if done.rejected:
            self._observer.cache_evictions("node", done.rejected, "rejected")
        self._observer.cache_bytes("node", done.bytes)

    async def _run(self, op: str, args: Any, items: int) -> tuple[WriteResult, int] | None:
        """Queue a write, wait for it and report it; ``None`` if it was dropped or failed
        (never raises: a cache write that fails is only a later miss)."""
        try:
            fut = self._enqueue(op, args, items)
        except RuntimeError:  # closed, or the queue is full
            self._observer.cache_errors("node", items)
            return None
        waiter = asyncio.wrap_future(fut)
        self._pending.add(waiter)
        try:
            result: tuple[WriteResult, int] = await waiter
        except Exception as exc:
            if isinstance(exc, lmdb.Error):
                log.warning("node cache %s failed: %s", op, type(exc).__name__)
            else:  # not the store's trouble: more likely a bug, so make it visible
                log.exception("node cache %s raised unexpected %s", op, type(exc).__name__)
            self._observer.cache_errors("node", items)
            return None
        finally:
            self._pending.discard(waiter)
        self._report(result[0])
        return result
