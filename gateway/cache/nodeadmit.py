"""The node tier's admission filter: one frequency sketch shared by every worker of the host.

The node tier is shared by the host's worker processes, so its idea of "asked for often" must
be too: a sketch per process would see a fraction of the traffic. The counters live in a small
file beside the LMDB environment (``admission.sketch``), memory-mapped by every worker; each
lookup counts its keys there (``record``, on the event loop: queued, then counted in
batches, no system call). Updates from two workers may race and lose a count now and then
(see ``sketch.py``).

Aging is shared too: each process counts its lookups in batches of up to ``LOCAL_BATCH`` and
adds each batch to a counter in the file's header; the process that takes it past the sample
period halves the table, under an ``flock`` so that two never halve it for the same period.

Admission with sampled eviction (``cache.node.eviction: sampled``, the default;
``nodesampled.py``): once the tier's bytes are at its budget, a new key is written only if
``estimate`` counts it more than the entry picked at random to make room for it.

Admission with generations (``filter``, in the writer's transaction): while the previous
generation holds entries the tier is full and every new key pushes others out, so a new key is
written only if it was asked for more often lately than a key sampled at random from the
previous generation (the entries the next rotation drops). Replacing a key that is already
stored always passes. A scan of one-off keys then cannot rotate out what every worker keeps
asking for."""

from __future__ import annotations

import fcntl
import mmap
import os
import random
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import lmdb

from gateway.cache.keys import CacheKey
from gateway.cache.sketch import FrequencySketch, buffer_size, table_width

FILE = "admission.sketch"
MAGIC = b"GWSK0001"
_HEADER = struct.Struct("<8sQQ")  # magic, width, lookups counted since the last halving
HEADER_SIZE = 64
#: Lookups a process counts together before it adds them to the shared table and count.
LOCAL_BATCH = 64
#: Keys of the previous generation sampled per newcomer; it must be asked more than the most
#: asked of them. Replayed (bench hitratio, Zipf 0.6/0.8 and scans at 1%/5%): 2 or 4 samples
#: change the tier's hit ratio by at most 0.02 of the oracle, and lose on shifting popularity.
VICTIMS = 1
#: Bytes an entry takes in the map, roughly (a 1.5 KB answer on LMDB pages): sizes the sketch.
ENTRY_BYTES = 2048


def digest_hash(digest: bytes) -> int:
    """The sketch's hash of a key: 8 bytes of its xxh3-128 digest, the same in every process
    (``hash()`` is salted per process); signed, as numpy's int64 takes it."""
    return int.from_bytes(digest[:8], "little", signed=True)


class _SharedSketch(FrequencySketch):
    """A sketch in a shared map whose aging period counts every process's lookups."""

    def __init__(self, entries: int, fd: int, mapped: mmap.mmap) -> None:
        self._fd = fd
        self._map = mapped
        super().__init__(entries, mapped, offset=HEADER_SIZE)
        self.batch = max(1, min(LOCAL_BATCH, self.sample // 16))

    def counted(self, n: int) -> None:
        """Add this batch to the shared count, and halve the table when the count passes the
        period (once per period, whichever process gets there first)."""
        magic, width, total = _HEADER.unpack_from(self._map, 0)
        total += n
        _HEADER.pack_into(self._map, 0, magic, width, total)
        if total < self.sample:
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            magic, width, total = _HEADER.unpack_from(self._map, 0)
            if total >= self.sample:  # nobody halved it for this period meanwhile
                self.age()
                _HEADER.pack_into(self._map, 0, magic, width, total // 2)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class NodeAdmission:
    """TinyLFU admission for the node tier (see the module docstring)."""

    def __init__(self, sketch: _SharedSketch) -> None:
        self.sketch = sketch
        self.rejected = 0
        self._random = random.Random()

    @classmethod
    def open(cls, path: str, map_size: int) -> NodeAdmission:
        """The filter of the node directory ``path`` (created or reset when missing or of
        another size), sized for a map of ``map_size`` bytes."""
        entries = max(64, map_size // ENTRY_BYTES)
        width = table_width(entries)
        size = HEADER_SIZE + buffer_size(width)
        fd = os.open(os.path.join(path, FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                head = os.pread(fd, _HEADER.size, 0)
                if (os.fstat(fd).st_size != size or len(head) != _HEADER.size
                        or _HEADER.unpack(head)[:2] != (MAGIC, width)):
                    # Another size or layout (the map size changed): start counting afresh.
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, size)
                    os.pwrite(fd, _HEADER.pack(MAGIC, width, 0), 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(_SharedSketch(entries, fd, mapped))

    def record(self, keys: Iterable[CacheKey]) -> None:
        """Count one lookup of each key (the event loop, on every node-tier lookup)."""
        self.sketch.add_many([int.from_bytes(k.digest[:8], "little", signed=True)
                              for k in keys])

    def estimate(self, raw: bytes) -> int:
        """The count of a stored key (its LMDB form ends with the 16-byte digest)."""
        return self.sketch.estimate(digest_hash(raw[-16:]))

    def filter(self, txn: lmdb.Transaction, cur: Any, prev: Any,
               puts: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The ``puts`` that earn a place (in the writer's transaction; see the docstring)."""
        if not puts or txn.stat(prev)["entries"] == 0:
            return list(puts)  # not full yet: everything is welcome
        cursor = txn.cursor(db=prev)
        kept: list[tuple[bytes, bytes]] = []
        for raw, value in puts:
            if txn.get(raw, db=cur) is not None or txn.get(raw, db=prev) is not None:
                kept.append((raw, value))  # a refresh of a stored key
                continue
            bar = max(self._sample(cursor, raw) for _ in range(VICTIMS))
            if self.estimate(raw) > bar:
                kept.append((raw, value))
            else:
                self.rejected += 1
        return kept

    def flush(self) -> None:
        """Count the lookups still queued (so another process sees them)."""
        self.sketch.flush()

    def _sample(self, cursor: lmdb.Cursor, raw: bytes) -> int:
        """The count of a key picked at random from the previous generation (near ``raw``'s
        model and scope when it has keys there)."""
        probe = raw[:-16] + self._random.getrandbits(128).to_bytes(16, "little")
        if not cursor.set_range(probe):
            cursor.first()
        victim = bytes(cursor.key())
        return self.estimate(victim) if victim else -1

    def close(self) -> None:
        sketch = self.sketch
        sketch.flush()
        sketch.release()
        try:
            sketch._map.close()
        finally:
            os.close(sketch._fd)
