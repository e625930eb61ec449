"""Microbenchmark of the cache's hot paths: key derivation, L1 get/set, entry encode/decode.

Run: ``python -m bench.cache [--n N]``. Prints nanoseconds per operation (best of 5 rounds of
``N`` operations each), with a 384-d float32 embedding (1536 bytes) as the value. Not a test:
numbers depend on the machine; the baseline row (a plain dict lookup in the same loop shape)
shows how fast this machine runs Python at the moment.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from gateway.cache.entry import Entry
from gateway.cache.keys import derive_key
from gateway.cache.memory import MemoryCache

VALUE = bytes(range(256)) * 6  # 1536 bytes: one 384-d float32 embedding
CONTEXT = {
    "route": "/v1/embeddings", "model": "minilm", "model_version": "1", "scope": "tenant-a",
    "normalization": "nfc-ws-v1",
}


def best_ns_per_op(fn: Callable[[int], None], n: int, rounds: int = 5) -> float:
    """Best of ``rounds`` runs of ``fn(n)`` (which performs n operations), in ns per operation."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def run(n: int) -> dict[str, float]:
    texts = [f"the quick brown fox number {i} jumps over the lazy dog".encode() for i in range(n)]
    keys = [derive_key(canonical=t, **CONTEXT) for t in texts]
    now = time.time()
    entry = Entry(VALUE, now, 3600.0, 60.0, 600.0, 4.2)
    blob = entry.encode()
    cache = MemoryCache(max_entries=n * 2, max_bytes=1 << 40)
    small = MemoryCache(max_entries=max(1, n // 10), max_bytes=1 << 40)

    plain = dict.fromkeys(keys, entry)

    def baseline(m: int) -> None:
        get = plain.get
        for key in keys[:m]:
            get(key)

    def key_one(m: int) -> None:
        for t in texts[:m]:
            derive_key(canonical=t, **CONTEXT)

    def l1_set(m: int) -> None:
        for key in keys[:m]:
            cache.set(key, entry)

    def l1_get_hit(m: int) -> None:
        get = cache.get
        for key in keys[:m]:
            get(key)

    def l1_set_evicting(m: int) -> None:
        for key in keys[:m]:
            small.set(key, entry)

    def redis_key(m: int) -> None:
        for key in keys[:m]:
            key.redis_key("gw:v1")

    def encode(m: int) -> None:
        for _ in range(m):
            entry.encode()

    def decode(m: int) -> None:
        for _ in range(m):
            Entry.decode(blob)

    benches: dict[str, Callable[[int], None]] = {
        "baseline: dict.get loop": baseline,
        "derive_key (one item)": key_one,
        "CacheKey.redis_key": redis_key,
        "L1 set (no eviction)": l1_set,
        "L1 get (hit)": l1_get_hit,
        "L1 set (evicting LRU)": l1_set_evicting,
        "Entry.encode (1536 B)": encode,
        "Entry.decode (1536 B)": decode,
    }
    return {name: best_ns_per_op(fn, n) for name, fn in benches.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cache",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000, help="operations per round")
    parser.add_argument("--quick", action="store_true", help="10k operations per round")
    args = parser.parse_args(argv)
    n = 10_000 if args.quick else max(1, min(args.n, 5_000_000))
    print("| operation | ns/op |")
    print("| --- | ---: |")
    for name, ns in run(n).items():
        print(f"| {name} | {ns:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
