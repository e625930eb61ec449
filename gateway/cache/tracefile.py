"""The cache trace recorder: what the cache was asked, for sizing it from real traffic.

Off by default (``cache.trace``). When on, every item lookup (the full path and hot answers)
and every store becomes one fixed-size record: the key's hash, the tenant's hash, the time and
the answer's size. Never text: the key hash is 8 bytes of the xxh3-128 digest the cache key
already is (what Redis keys show), the tenant hash 8 bytes of xxh3-64 of the scope.
``python -m bench hitratio --trace FILE`` replays it against every tier and the optimum.

Bounded: recording stops for good once the file holds ``max_bytes`` or ``max_seconds`` have
passed since the first record. Records go to a list on the event loop (one tuple append); a
thread of the recorder writes them every ``FLUSH_S`` seconds, so the loop never waits for disk.

File layout: ``MAGIC`` then records of ``RECORD`` (little-endian): key hash u64, tenant hash
u64, unix time f64, answer bytes u32 (0 for a lookup that missed), kind u8 (0 lookup, 1 store).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import xxhash

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.settings import TraceSettings

log = logging.getLogger(__name__)

MAGIC = b"GWTRACE1"
RECORD = struct.Struct("<QQdIB")
LOOKUP, STORE = 0, 1
FLUSH_S = 0.5


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One record read back from a trace file."""

    key: int
    tenant: int
    at: float
    size: int
    kind: int


def _tenant_hash(scope: str, cache: dict[str, int]) -> int:
    h = cache.get(scope)
    if h is None:
        if len(cache) > 65_536:
            cache.clear()
        h = cache[scope] = xxhash.xxh3_64_intdigest(scope.encode("utf-8"))
    return h


class TraceRecorder:
    """Records lookups and stores to ``path`` within the bounds (see the module docstring)."""

    def __init__(self, path: str, *, max_bytes: int, max_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.max_records = max(0, (max_bytes - len(MAGIC)) // RECORD.size)
        self.max_seconds = max_seconds
        self.clock = clock
        self.records = 0  # taken so far (written or queued)
        self.active = True
        self._started: float | None = None
        self._buf: list[tuple[int, int, float, int, int]] = []
        self._tenants: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        with open(path, "wb") as out:
            out.write(MAGIC)
        self._thread = threading.Thread(target=self._run, name="cache-trace", daemon=True)
        self._thread.start()

    def record(self, keys: Sequence[CacheKey], entries: Iterable[Entry | None],
               kind: int = LOOKUP) -> None:
        """Record one lookup (or store) per key; ``entries`` give the sizes (None: a miss)."""
        if not self.active:
            return
        now = self.clock()
        if self._started is None:
            self._started = now
        if now - self._started > self.max_seconds or self.records >= self.max_records:
            self._finish("time" if now - self._started > self.max_seconds else "size")
            return
        room = self.max_records - self.records
        buf = self._buf
        tenants = self._tenants
        taken = 0
        for key, entry in zip(keys, entries, strict=True):
            if taken == room:
                break
            size = 0 if entry is None else len(entry.value) + len(entry.meta)
            buf.append((int.from_bytes(key.digest[:8], "little"),
                        _tenant_hash(key.scope, tenants), now, min(size, 0xFFFFFFFF), kind))
            taken += 1
        self.records += taken

    def _finish(self, why: str) -> None:
        self.active = False
        log.info("cache trace: %d records in %s; stopped (%s bound reached)", self.records,
                 self.path, why)
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            with self._lock:
                stop = self._stop
            self._write()
            if stop:
                return

    def _write(self) -> None:
        # The loop only appends; swapping the list is atomic under the GIL.
        batch, self._buf = self._buf, []
        if not batch:
            return
        data = b"".join(RECORD.pack(*r) for r in batch)
        try:
            with open(self.path, "ab") as out:
                out.write(data)
        except OSError as exc:
            log.warning("cache trace: cannot write %s (%s); recording stopped", self.path, exc)
            self.active = False

    def close(self) -> None:
        """Write what is queued and stop the thread (blocks briefly: call off the loop)."""
        self.active = False
        with self._lock:
            self._stop = True
        self._wake.set()
        self._thread.join()


def open_recorder(settings: TraceSettings, clock: Callable[[], float] = time.time,
                  ) -> TraceRecorder | None:
    """This worker's recorder (its file is ``settings.path`` + ``.<pid>``), or None when off
    or the file cannot be created (said once, and the gateway serves on)."""
    if not settings.enabled:
        return None
    path = f"{settings.path}.{os.getpid()}"
    try:
        rec = TraceRecorder(path, max_bytes=settings.max_bytes, max_seconds=settings.max_seconds,
                            clock=clock)
    except OSError as exc:
        log.warning("cache trace: cannot create %s (%s); not recording", path, exc)
        return None
    log.info("cache trace: recording to %s (hashes and sizes only)", path)
    return rec


def read_trace(path: str) -> list[TraceRecord]:
    """Every lookup record of a trace file, with the size each key's answer had when known
    (from a hit or a store of it, else 0)."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path} is not a cache trace (no {MAGIC!r} header)")
    body = memoryview(data)[len(MAGIC):]
    whole = len(body) - len(body) % RECORD.size
    rows = list(RECORD.iter_unpack(body[:whole]))
    sizes: dict[int, int] = {}
    for key, _, _, size, _ in rows:
        if size and key not in sizes:
            sizes[key] = size
    return [TraceRecord(key, tenant, at, sizes.get(key, 0), kind)
            for key, tenant, at, _, kind in rows if kind == LOOKUP]
