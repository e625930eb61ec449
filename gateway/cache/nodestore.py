"""The node tier's storage: one LMDB environment in a directory, two rotating generations.

LMDB is a memory-mapped B+tree with copy-on-write pages: a write transaction commits by
switching one meta page, so a process killed mid-write leaves the last committed state intact
(nothing to repair); readers see a snapshot and never block, and one writer at a time holds a
lock shared by every process that opens the directory.

Layout: named databases ``gen0`` and ``gen1`` hold entries; ``meta`` holds ``current`` (which
of the two takes writes) and the layout ``version``. Bounded eviction by rotation: when the
current generation's pages pass ``generation_bytes`` (a bit under half the map), one write
transaction empties the previous generation (its entries count as evictions) and makes it
current, so the swap is atomic for every process. A hit in the previous generation is moved
into the current one (``promote``), so what is still read survives the next rotation.

A key reads ``{model}:{tag}:`` + a 16-byte digest: the model and the scope's tag in clear so
purges can find them, tenant ids never. Entries are scoped by the deployment that wrote them
(``gateway/cache/deployment.py``): the tag hashes the deployment's ``namespace`` with the scope
(``node_tag``; ``gateway.cache.keys.scope_tag`` without one), and the digest is the cache key's,
rehashed with the model's identity (the served graph's SHA-256) when its backends report one.
Two gateways sharing a directory with another tenants file, deployment name or model graph
thus never read each other's entries, while identically configured ones share them.

A value is the entry's deadline (f64, little-endian: the earlier of the entry's ``expires_at``
and the tier's own TTL) followed by ``Entry.encode()`` bytes, which check themselves.

Nothing here is async or thread-aware: ``node.py`` reads on the event loop and writes on one
writer thread. How the environment is opened (once per process, commits without fsync, a
directory from before a host restart started empty): ``lmdbenv.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import lmdb
import xxhash

from gateway.cache.keys import CacheKey, scope_tag
from gateway.cache.lmdbenv import close_env, open_env

LAYOUT_VERSION = b"node-1"
_DEADLINE = struct.Struct("<d")
_MAX_KEY = 511  # LMDB's compiled-in key size limit
#: Part of the map kept free of entries: copy-on-write pages of the transaction in progress,
#: the free list, and pages freed by a rotation that a reader still sees.
RESERVE_FRACTION = 0.125
MIN_MAP_BYTES = 1024 * 1024

KeyBytes = bytes


def node_tag(namespace: str, scope: str) -> str:
    """The scope's tag in this deployment's keys: 16 hex characters, like ``scope_tag``."""
    if not namespace:
        return scope_tag(scope)
    return xxhash.xxh3_64_hexdigest(f"{namespace}\0{scope}".encode())


@lru_cache(maxsize=4096)
def _prefix(namespace: str, model: str, scope: str) -> bytes:
    return f"{model}:{node_tag(namespace, scope)}:".encode()


def encode_key(key: CacheKey, namespace: str = "", model_identity: str = "") -> KeyBytes | None:
    """The LMDB key of a cache key in ``namespace`` (the deployment's), for a model whose
    served graph is ``model_identity`` ("" unknown); ``None`` if it would pass LMDB's key size
    limit."""
    digest = key.digest
    if model_identity:
        digest = xxhash.xxh3_128_digest(model_identity.encode() + b"\0" + digest)
    raw = _prefix(namespace, key.model, key.scope) + digest
    return raw if len(raw) <= _MAX_KEY else None


def key_matches(raw: bytes, model: str | None, tag: str | None) -> bool:
    """Does a stored key belong to ``model`` / the scope with ``tag`` (None = any)?

    Parsed from the right (digest, then tag), so a model name holding ``:`` is matched exactly.
    """
    if len(raw) < 16 + 18:
        return False
    head = raw[:-16]  # "{model}:{tag}:"
    if head[-1:] != b":" or head[-18:-17] != b":":
        return False
    if tag is not None and head[-17:-1] != tag.encode():
        return False
    return model is None or head[:-18] == model.encode()


def pack(deadline: float, blob: bytes) -> bytes:
    return _DEADLINE.pack(deadline) + blob


def unpack_deadline(value: bytes) -> float:
    """The stored deadline; NaN for a value too short to hold one (never served)."""
    if len(value) < _DEADLINE.size:
        return float("nan")
    return float(_DEADLINE.unpack_from(value)[0])


class Admission(Protocol):
    """Decides, inside a write transaction, which new entries are written (``nodeadmit.py``)."""

    def filter(self, txn: lmdb.Transaction, cur: Any, prev: Any,
               puts: Sequence[tuple[KeyBytes, bytes]]) -> list[tuple[KeyBytes, bytes]]: ...


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write transaction did."""

    stored: int = 0
    evicted: int = 0
    rotations: int = 0
    bytes: int = 0
    rejected: int = 0  # new entries the admission filter kept out


class GenerationStore:
    """Two rotating generations in one LMDB environment (see the module docstring)."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.map_size = max(max_bytes, MIN_MAP_BYTES)
        self.generation_bytes = int(self.map_size * (1.0 - RESERVE_FRACTION) / 2)
        self.env = open_env(path, self.map_size)
        #: Entries both generations held after the last write, before any rotation it caused.
        self.last_peak = 0
        try:
            with self.env.begin(write=True) as txn:
                self._meta = self.env.open_db(b"meta", txn=txn)
                self._gens = (self.env.open_db(b"gen0", txn=txn),
                              self.env.open_db(b"gen1", txn=txn))
                if txn.get(b"version", db=self._meta) != LAYOUT_VERSION:
                    # A directory from another layout: its entries mean nothing here.
                    for db in self._gens:
                        txn.drop(db, delete=False)
                    for name in (b"entries", b"ids"):  # the sampled layout's (nodesampled.py)
                        txn.drop(self.env.open_db(name, txn=txn), delete=False)
                    txn.put(b"version", LAYOUT_VERSION, db=self._meta)
                    txn.put(b"current", b"0", db=self._meta)
            self.psize = int(self.env.stat()["psize"])
            self.reader_check()
        except BaseException:
            close_env(self.env)
            raise

    def close(self) -> None:
        close_env(self.env)

    def reader_check(self) -> int:
        """Free the reader slots of processes that died mid-read; returns how many."""
        return int(self.env.reader_check())

    def _roles(self, txn: lmdb.Transaction[bytes]) -> tuple[lmdb._Database, lmdb._Database]:
        """(current, previous) as this transaction sees them."""
        cur = 1 if txn.get(b"current", db=self._meta) == b"1" else 0
        return self._gens[cur], self._gens[1 - cur]

    # -- reads (event loop thread) -------------------------------------------------------------

    def read(self, keys: Sequence[KeyBytes | None]) -> tuple[list[bytes | None], list[KeyBytes]]:
        """Stored values for ``keys`` in one snapshot, and the keys found only in the previous
        generation (for the caller to ``promote``)."""
        out: list[bytes | None] = []
        old: list[KeyBytes] = []
        with self.env.begin(buffers=False) as txn:
            cur, prev = self._roles(txn)
            get = txn.get
            for raw in keys:
                if raw is None:
                    out.append(None)
                    continue
                value = get(raw, db=cur)
                if value is None:
                    value = get(raw, db=prev)
                    if value is not None:
                        old.append(raw)
                out.append(value)
        return out, old

    def used_bytes(self) -> tuple[int, int]:
        """(bytes of pages both generations hold, entries in both)."""
        with self.env.begin() as txn:
            return self._usage(txn)

    def _usage(self, txn: lmdb.Transaction[bytes]) -> tuple[int, int]:
        pages = entries = 0
        for db in self._gens:
            s = txn.stat(db)
            pages += s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
            entries += s["entries"]
        return pages * self.psize, entries

    def _pages(self, txn: lmdb.Transaction, db: lmdb._Database) -> int:
        s = txn.stat(db)
        return (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * self.psize

    # -- writes (the writer thread) --------------------------------------------------------------

    def write(self, puts: Sequence[tuple[KeyBytes, bytes]], promotes: Iterable[KeyBytes],
              deletes: Iterable[KeyBytes] = (), *, admit: Admission | None = None,
              ) -> tuple[WriteResult, int]:
        """One transaction: ``deletes``, then ``puts`` into the current generation (those
        ``admit`` lets in, when given), then moves of ``promotes`` from the previous one (if
        still there and not newer in the current), then a rotation if the current generation
        passed its bound. Returns what it did and how many ``deletes`` existed. Raises
        ``lmdb.MapFullError`` (nothing written) when the map is full.
        """
        with self.env.begin(write=True) as txn:
            cur, prev = self._roles(txn)
            deleted = 0
            for raw in deletes:
                deleted += int(txn.delete(raw, db=cur)) + int(txn.delete(raw, db=prev))
            rejected = 0
            if admit is not None and puts:
                offered = len(puts)
                puts = admit.filter(txn, cur, prev, puts)
                rejected = offered - len(puts)
            stored = 0
            for raw, value in puts:
                txn.put(raw, value, db=cur)
                stored += 1
            for raw in promotes:
                old = txn.get(raw, db=prev)
                if old is not None and txn.put(raw, old, db=cur, overwrite=False):
                    txn.delete(raw, db=prev)
            evicted = rotations = 0
            if self._pages(txn, cur) >= self.generation_bytes:
                self.last_peak = self._usage(txn)[1]
                evicted = self._rotate(txn)
                rotations = 1
            used, entries = self._usage(txn)
            if not rotations:
                self.last_peak = entries
        return WriteResult(stored, evicted, rotations, used, rejected), deleted

    def rotate(self) -> WriteResult:
        """Rotate now (one transaction): empty the previous generation and make it current."""
        with self.env.begin(write=True) as txn:
            evicted = self._rotate(txn)
            used, _ = self._usage(txn)
        return WriteResult(evicted=evicted, rotations=1, bytes=used)

    def _rotate(self, txn: lmdb.Transaction[bytes]) -> int:
        _, prev = self._roles(txn)
        evicted = int(txn.stat(prev)["entries"])
        txn.drop(prev, delete=False)
        txn.put(b"current", b"1" if prev is self._gens[1] else b"0", db=self._meta)
        txn.put(b"rotations", b"%d" % (self._rotations(txn) + 1), db=self._meta)
        return evicted

    def _rotations(self, txn: lmdb.Transaction[bytes]) -> int:
        return int(txn.get(b"rotations", b"0", db=self._meta))

    def rotations(self) -> int:
        """Rotations since the directory was created (every process's)."""
        with self.env.begin() as txn:
            return self._rotations(txn)

    def purge(self, model: str | None, tag: str | None) -> tuple[int, int]:
        """Remove every entry of ``model`` and/or the scope with ``tag`` (None = any), in one
        transaction; returns (removed, bytes in use after)."""
        removed = 0
        with self.env.begin(write=True) as txn:
            for db in self._gens:
                if model is None and tag is None:
                    removed += int(txn.stat(db)["entries"])
                    txn.drop(db, delete=False)
                    continue
                removed += self._purge_db(txn, db, model, tag)
            used, _ = self._usage(txn)
        return removed, used

    @staticmethod
    def _purge_db(txn: lmdb.Transaction[bytes], db: lmdb._Database, model: str | None,
                  tag: str | None) -> int:
        cursor = txn.cursor(db=db)
        # With a model the keys to look at are contiguous from "{model}:"; else scan them all.
        start = b"" if model is None else model.encode() + b":"
        if not (cursor.set_range(start) if start else cursor.first()):
            return 0
        doomed: list[bytes] = []
        for raw in cursor.iternext(keys=True, values=False):
            if start and not raw.startswith(start):
                break
            if key_matches(raw, model, tag):
                doomed.append(raw)
        for raw in doomed:
            txn.delete(raw, db=db)
        return len(doomed)
