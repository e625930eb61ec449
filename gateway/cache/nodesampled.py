"""The node tier's storage with sampled eviction: one LMDB database, no generations.

The alternative to ``nodestore.GenerationStore`` (setting ``cache.node.eviction: sampled``).
Entries live in one named database ``entries`` (key and value as in ``nodestore``); a second
one, ``ids``, maps each entry's 16-byte digest followed by the rest of its key (value empty) so
that a random 16-byte probe lands on an entry picked near-uniformly whatever its model and
scope (the digests are xxh3 output). ``meta`` holds the layout ``version`` and ``bytes``, the
sum of ``len(key) + len(value)`` over the entries, kept in the same transactions.

Bound: a write that would take ``bytes`` past ``budget`` (a fraction ``DATA_FILL`` of the map
left after ``RESERVE_FRACTION``, since B-tree pages are never full) evicts first, and a write
that leaves the pages of both databases past ``page_bound`` evicts more (large answers on
overflow pages), at most ``MAX_EVICT`` per new entry and transaction. Eviction is Redis-style:
``SAMPLES`` entries sampled at random, the victim the one with the lowest count in the shared
sketch (``nodeadmit.py``), entries past their deadline (never served again) first, ties to the
earliest deadline (the oldest write). With admission on, a new key is written only if the
sketch counts it more than the *second* least counted of the samples (``BAR_RANK``: TinyLFU
against a bar a little above the victim, since the victim's own count is a low bar that lets
one-off keys churn in); the entry evicted for it is the least counted. Replacing a stored key
always passes. Without admission the lowest count is 0 for all, so the sampled oldest goes.

Every step is inside one LMDB write transaction, so every worker process of the host sees the
tier consistent; a reader reads one database (no generation to find, nothing to promote).
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import lmdb

from gateway.cache import nodestore
from gateway.cache.lmdbenv import close_env, open_env
from gateway.cache.nodestore import (
    RESERVE_FRACTION,
    KeyBytes,
    WriteResult,
    key_matches,
    unpack_deadline,
)

LAYOUT_VERSION = b"node-s1"
#: Entries sampled per eviction (Redis: 5): the victim is the least counted of them (without
#: admission, the oldest).
SAMPLES = 5
#: The admission bar: the count of the BAR_RANK-th least counted sample (0: the victim's own).
#: The second least (1) beats the victim's own count (newcomers pass a low bar and churn), a
#: single random sample (a noisy bar: runs at 1% vary by 0.1) and the median (the shifting
#: working set loses); bench/RESULTS.md, "Node tier: the bar and the victim".
BAR_RANK = 1
#: Entry bytes (keys + values) allowed per byte of the map left after the reserve: pages of a
#: B-tree with random inserts and deletes are little over half full (1.5 KB answers: 0.57).
DATA_FILL = 0.5
#: Map kept free on top of the reserve for the pages a write transaction copies (every leaf it
#: touches, in both databases) and those the previous snapshot still holds: at 16 new entries
#: and as many evictions per transaction, ~100 pages of 4 KiB; fixed, so a large map loses
#: nothing to it while a small one (the bench's) does not fill up mid-transaction.
IN_FLIGHT_BYTES = 512 * 1024
#: Evictions per new entry in one transaction, at most (the page guard's loop bound).
MAX_EVICT = 8
_BYTES = struct.Struct("<Q")


class Estimator(Protocol):
    """The admission's sketch (``nodeadmit.NodeAdmission``)."""

    rejected: int

    def estimate(self, raw: bytes) -> int: ...


def _by_rank(sample: tuple[int, float, KeyBytes]) -> tuple[int, float]:
    return sample[0], sample[1]


def _id(raw: KeyBytes) -> bytes:
    return raw[-16:] + raw[:-16]


def _raw(ident: bytes) -> KeyBytes:
    return ident[16:] + ident[:16]


class SampledStore:
    """One LMDB database with sampled eviction (see the module docstring)."""

    def __init__(self, path: str, max_bytes: int, *, samples: int = SAMPLES,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.map_size = max(max_bytes, nodestore.MIN_MAP_BYTES)
        self.page_bound = int(self.map_size * (1.0 - RESERVE_FRACTION)) - IN_FLIGHT_BYTES
        self.budget = max(0, int(self.page_bound * DATA_FILL))
        #: The writer's name for "the most one batch may hold" (``nodewriter``).
        self.generation_bytes = self.budget
        self.samples = samples
        self.env = open_env(path, self.map_size)
        self.last_peak = 0
        #: Count ``last_peak`` (the entries held at the fullest point of the last write, for the
        #: hit-ratio replays): a ``stat`` per write, which the live tier does not need.
        self.track_peak = False
        self.clock = clock  # entries past their deadline by it are evicted first
        self._random = random.Random()
        try:
            with self.env.begin(write=True) as txn:
                self._meta = self.env.open_db(b"meta", txn=txn)
                self._db = self.env.open_db(b"entries", txn=txn)
                self._ids = self.env.open_db(b"ids", txn=txn)
                if txn.get(b"version", db=self._meta) != LAYOUT_VERSION:
                    # Another layout (the generations'): start empty, and free its pages.
                    for name in (b"gen0", b"gen1", b"entries", b"ids"):
                        txn.drop(self.env.open_db(name, txn=txn), delete=False)
                    txn.put(b"version", LAYOUT_VERSION, db=self._meta)
                    txn.put(b"bytes", _BYTES.pack(0), db=self._meta)
            self.psize = int(self.env.stat()["psize"])
            self.reader_check()
        except BaseException:
            close_env(self.env)
            raise

    @staticmethod
    def map_for(data_bytes: int) -> int:
        """The map size whose ``budget`` holds ``data_bytes`` of keys and values."""
        return int((data_bytes / DATA_FILL + IN_FLIGHT_BYTES) / (1.0 - RESERVE_FRACTION)) + 1

    def close(self) -> None:
        close_env(self.env)

    def reader_check(self) -> int:
        return int(self.env.reader_check())

    # -- reads -----------------------------------------------------------------------------------

    def read(self, keys: Sequence[KeyBytes | None]) -> tuple[list[bytes | None], list[KeyBytes]]:
        """Stored values for ``keys`` in one snapshot (nothing to promote: second item empty)."""
        with self.env.begin(db=self._db, buffers=False) as txn:
            get = txn.get
            return [None if raw is None else get(raw) for raw in keys], []

    def used_bytes(self) -> tuple[int, int]:
        """(bytes of pages the entries hold, entries)."""
        with self.env.begin() as txn:
            return self._pages(txn), int(txn.stat(self._db)["entries"])

    def data_bytes(self) -> int:
        with self.env.begin() as txn:
            return self._bytes(txn)

    def _pages(self, txn: lmdb.Transaction) -> int:
        pages = 0
        for db in (self._db, self._ids):
            s = txn.stat(db)
            pages += s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
        return pages * self.psize

    def _bytes(self, txn: lmdb.Transaction) -> int:
        found = txn.get(b"bytes", db=self._meta)
        return 0 if found is None else int(_BYTES.unpack(bytes(found))[0])

    # -- writes ----------------------------------------------------------------------------------

    def write(self, puts: Sequence[tuple[KeyBytes, bytes]], promotes: Iterable[KeyBytes] = (),
              deletes: Iterable[KeyBytes] = (), *, admit: Estimator | None = None,
              ) -> tuple[WriteResult, int]:
        """One transaction: ``deletes``, then each of ``puts`` (a new key after evicting what
        makes room, if ``admit`` lets it in). ``promotes`` are ignored (no generations).
        Returns what it did and how many ``deletes`` existed."""
        del promotes
        with self.env.begin(write=True) as txn:
            used = self._bytes(txn)
            # Kept by hand below; one stat, and only for the replays' peak.
            entries = int(txn.stat(self._db)["entries"]) if self.track_peak else 0
            deleted = 0
            for raw in deletes:
                old = txn.pop(raw, db=self._db)
                if old is not None:
                    deleted += 1
                    used -= len(raw) + len(old)
                    txn.delete(_id(raw), db=self._ids)
            entries -= deleted
            stored = evicted = rejected = 0
            cursor = txn.cursor(db=self._ids)
            fresh: set[KeyBytes] = set()  # new keys written here: never this write's victims
            peak = 0  # entries held after each new one is in (before the page guard)
            for raw, value in puts:
                size = len(raw) + len(value)
                old = txn.get(raw, db=self._db)
                if old is not None:  # a refresh of a stored key: always written
                    txn.put(raw, value, db=self._db)
                    used += size - len(raw) - len(old)
                    stored += 1
                    continue
                ok = True
                # MAX_EVICT victims at most; a draw that lands on an entry this transaction
                # wrote is drawn again (up to 4 x MAX_EVICT draws), so that a batch's own
                # entries do not use up the draws and leave a write without room.
                draws = 0
                for _ in range(4 * MAX_EVICT):
                    if used + size <= self.budget or draws >= MAX_EVICT:
                        break
                    victim, count = self._victim(txn, cursor, admit, fresh)
                    if victim is None:
                        break
                    if victim in fresh:
                        continue  # written by this transaction: another sample
                    draws += 1
                    if admit is not None and count >= 0 and admit.estimate(raw) <= count:
                        ok = False
                        break
                    used -= self._evict(txn, victim)
                    evicted += 1
                    entries -= 1
                if not ok or used + size > self.budget:
                    rejected += 1
                    if admit is not None:
                        admit.rejected += 1
                    continue
                txn.put(raw, value, db=self._db)
                txn.put(_id(raw), b"", db=self._ids)
                fresh.add(raw)
                used += size
                entries += 1
                peak = max(peak, entries)
                stored += 1
            # The page guard: answers on overflow pages or a sparse tree may outgrow the bytes.
            pages = self._pages(txn)
            for _ in range(MAX_EVICT * max(1, len(puts))):
                if pages < self.page_bound:
                    break
                victim, _count = self._victim(txn, cursor, None, fresh)
                if victim is None:
                    break
                if victim in fresh:
                    continue  # what this transaction wrote stays readable after it
                used -= self._evict(txn, victim)
                evicted += 1
                entries -= 1
                pages = self._pages(txn)
            txn.put(b"bytes", _BYTES.pack(max(0, used)), db=self._meta)
            if self.track_peak:
                self.last_peak = max(peak, entries)
        return WriteResult(stored, evicted, 0, pages, rejected), deleted

    def _victim(self, txn: lmdb.Transaction, cursor: lmdb.Cursor, admit: Estimator | None,
                skip: frozenset[KeyBytes] | set[KeyBytes] = frozenset(),
                ) -> tuple[KeyBytes | None, int]:
        """The entry to evict among ``samples`` picked at random (the least counted), and the
        admission bar: the count of the ``BAR_RANK``-th least counted sample (the victim's own
        with one sample; -1 when the victim is past its deadline; 0 for all without ``admit``).
        Samples in ``skip`` (written by this transaction) are passed over; when every sample is
        in it, the first is returned (the caller draws again)."""
        now = self.clock()
        ranked: list[tuple[int, float, KeyBytes]] = []
        first: KeyBytes | None = None
        for _ in range(self.samples):
            probe = self._random.getrandbits(128).to_bytes(16, "little")
            if not cursor.set_range(probe) and not cursor.first():
                return None, 0  # empty
            raw = _raw(bytes(cursor.key()))
            if first is None:
                first = raw
            if raw in skip:
                continue
            value = txn.get(raw, db=self._db)
            deadline = unpack_deadline(bytes(value)) if value is not None else float("nan")
            if not deadline > now:
                ranked.append((-1, 0.0, raw))
            else:
                ranked.append((admit.estimate(raw) if admit is not None else 0, deadline, raw))
        if not ranked:
            return first, 0
        # By count, then deadline; equal ones stay in the order drawn (random). Never by key:
        # ties broken by key order took the replays of Zipf 0.8 at 1% from 0.89-0.95 of the
        # oracle to 0.62 in one run of three (always evicting the lowest digests among ties
        # skews where the random probes land, likely by leaving gaps in the id space).
        ranked.sort(key=_by_rank)
        victim = ranked[0]
        if victim[0] < 0:
            return victim[2], -1
        return victim[2], ranked[min(BAR_RANK, len(ranked) - 1)][0]

    def _evict(self, txn: lmdb.Transaction, raw: KeyBytes) -> int:
        """Remove ``raw``; returns its bytes."""
        old = txn.pop(raw, db=self._db)
        txn.delete(_id(raw), db=self._ids)
        return 0 if old is None else len(raw) + len(old)

    def rotate(self) -> WriteResult:
        """Free room after a full map (the writer's fallback): evict an eighth of the entries,
        sampled, oldest first, in one transaction."""
        evicted = 0
        with self.env.begin(write=True) as txn:
            used = self._bytes(txn)
            cursor = txn.cursor(db=self._ids)
            for _ in range(max(1, int(txn.stat(self._db)["entries"]) // 8)):
                victim, _count = self._victim(txn, cursor, None)
                if victim is None:
                    break
                used -= self._evict(txn, victim)
                evicted += 1
            txn.put(b"bytes", _BYTES.pack(max(0, used)), db=self._meta)
            pages = self._pages(txn)
        return WriteResult(evicted=evicted, rotations=1, bytes=pages)

    def rotations(self) -> int:
        return 0

    def purge(self, model: str | None, tag: str | None) -> tuple[int, int]:
        """Remove every entry of ``model`` and/or the scope with ``tag`` (None = any), in one
        transaction; returns (removed, bytes of pages in use after)."""
        with self.env.begin(write=True) as txn:
            if model is None and tag is None:
                removed = int(txn.stat(self._db)["entries"])
                txn.drop(self._db, delete=False)
                txn.drop(self._ids, delete=False)
                txn.put(b"bytes", _BYTES.pack(0), db=self._meta)
                return removed, self._pages(txn)
            cursor = txn.cursor(db=self._db)
            start = b"" if model is None else model.encode() + b":"
            doomed: list[bytes] = []
            if cursor.set_range(start) if start else cursor.first():
                for raw in cursor.iternext(keys=True, values=False):
                    if start and not raw.startswith(start):
                        break
                    if key_matches(raw, model, tag):
                        doomed.append(raw)
            used = self._bytes(txn)
            for raw in doomed:
                used -= self._evict(txn, raw)
            txn.put(b"bytes", _BYTES.pack(max(0, used)), db=self._meta)
            return len(doomed), self._pages(txn)
