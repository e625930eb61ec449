"""Replays of a key trace through the gateway's real cache tiers, for ``bench hitratio``.

- ``replay_l1``: ``gateway.cache.memory.MemoryCache`` as the pipeline uses it: ``get`` per
  request; on a miss, ``set`` of an ``Entry`` whose value has the answer's size.
- ``replay_node``: the node tier's store (``GenerationStore``, LMDB in a temporary directory)
  with its admission filter (``NodeAdmission``), called in the order ``NodeCache`` calls them:
  a lookup counts the keys and reads one snapshot; hits in the previous generation are moved
  forward; misses are written. ``NodeCache`` hands writes to its writer thread, which merges
  what queued meanwhile into one transaction; here writes are merged every ``WRITE_BATCH``
  requests, so a key asked twice within one batch misses twice, as it would live.

Each returns one hit flag per request. Keys become real ``CacheKey``s (xxh3-128 digests, scope
per tenant), so hashing and LMDB key order are the production ones.
"""

from __future__ import annotations

import tempfile

import numpy as np
import xxhash

from gateway.cache import nodestore
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.memory import ENTRY_OVERHEAD, MemoryCache
from gateway.cache.nodeadmit import NodeAdmission
from gateway.cache.nodesampled import SampledStore
from gateway.cache.nodestore import GenerationStore, encode_key, pack

NOW = 1_000_000.0
TTL = 1e9
WRITE_BATCH = 16
#: A map this small is below what settings accept (1 MiB): the bench shrinks the floor so the
#: node tier can be replayed at 1% of 20,000 keys.
BENCH_MIN_MAP = 64 * 1024


def cache_keys(keys: np.ndarray, tenants: np.ndarray) -> list[CacheKey]:
    """One production-shaped key per request (the same object for the same key)."""
    made: dict[tuple[int, int], CacheKey] = {}
    out: list[CacheKey] = []
    for k, t in zip(keys.tolist(), tenants.tolist(), strict=True):
        key = made.get((k, t))
        if key is None:
            digest = xxhash.xxh3_128_digest(k.to_bytes(8, "little") + t.to_bytes(2, "little"))
            key = made[(k, t)] = CacheKey("minilm", f"tenant-{t}", digest)
        out.append(key)
    return out


def _values(sizes: np.ndarray) -> dict[int, bytes]:
    return {s: bytes(s) for s in np.unique(sizes).tolist()}


def replay_l1(keys: list[CacheKey], sizes: np.ndarray, *, max_entries: int, max_bytes: int,
              admission: bool) -> np.ndarray:
    """Hit flags of the real L1 with these bounds (its ``max_bytes`` counts ``ENTRY_OVERHEAD``
    per entry on top of the answer)."""
    cache = MemoryCache(max_entries, max_bytes, clock=lambda: NOW, admission=admission)
    values = _values(sizes)
    hits = np.zeros(len(keys), dtype=bool)
    get, put = cache.get, cache.set
    for i, (key, size) in enumerate(zip(keys, sizes.tolist(), strict=True)):
        if get(key) is not None:
            hits[i] = True
        else:
            put(key, Entry(values[size], NOW, TTL))
    return hits


def l1_bytes(sizes: np.ndarray) -> np.ndarray:
    """What the L1 charges per request's entry."""
    return sizes + ENTRY_OVERHEAD


def node_entry_bytes(size: int) -> int:
    """What one entry of an answer of ``size`` bytes takes in the node tier (key + value)."""
    raw = encode_key(cache_keys(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int8))[0])
    assert raw is not None
    return len(raw) + len(pack(NOW + TTL, Entry(bytes(size), NOW, TTL).encode()))


def replay_node(keys: list[CacheKey], sizes: np.ndarray, *, max_bytes: int,
                admission: bool, eviction: str = "generations") -> tuple[np.ndarray, int]:
    """Hit flags of the node tier with a map of ``max_bytes``, and the most entries it held;
    ``eviction``: ``generations`` (``GenerationStore``) or ``sampled`` (``SampledStore``)."""
    values = _values(sizes)
    hits = np.zeros(len(keys), dtype=bool)
    peak = 0
    floor, nodestore.MIN_MAP_BYTES = nodestore.MIN_MAP_BYTES, BENCH_MIN_MAP
    with tempfile.TemporaryDirectory(prefix="hitratio-node-") as path:
        store: GenerationStore | SampledStore = (
            SampledStore(path, max_bytes, clock=lambda: NOW) if eviction == "sampled"
            else GenerationStore(path, max_bytes))
        if isinstance(store, SampledStore):
            store.track_peak = True  # the tier's high-water mark, which the table reports
        admit = NodeAdmission.open(path, store.map_size) if admission else None
        try:
            pending: dict[bytes, bytes] = {}
            promotes: list[bytes] = []
            for i, (key, size) in enumerate(zip(keys, sizes.tolist(), strict=True)):
                raw = encode_key(key)
                assert raw is not None
                if admit is not None:
                    admit.record((key,))
                found, old = store.read([raw])
                if found[0] is not None:
                    hits[i] = True
                    promotes += old
                elif raw not in pending:
                    pending[raw] = pack(NOW + TTL, Entry(values[size], NOW, TTL).encode())
                if i % WRITE_BATCH == WRITE_BATCH - 1:
                    peak = max(peak, _flush(store, admit, pending, promotes))
                    pending, promotes = {}, []
            peak = max(peak, _flush(store, admit, pending, promotes))
        finally:
            nodestore.MIN_MAP_BYTES = floor
            if admit is not None:
                admit.close()
            store.close()
    return hits, peak


def _flush(store: GenerationStore | SampledStore, admit: NodeAdmission | None,
           pending: dict[bytes, bytes], promotes: list[bytes]) -> int:
    """Write one batch as the writer thread would; returns the entries held before any
    rotation it caused (the tier's high-water mark)."""
    puts = list(pending.items())
    try:
        store.write(puts, promotes, admit=admit)
    except Exception as exc:  # a map too small for one batch: the tier drops it, like live
        if type(exc).__name__ != "MapFullError":
            raise
        store.rotate()
    return store.last_peak
