"""The L1 hit path's cost, for callgrind (issue 27): ``MemoryCache.get`` hits in a loop.

Run: ``PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null
python -m bench.hitcost N [--no-admission]`` for N = 20000 and N = 0; the difference of the
"Collected" instruction counts over N is the cost of one hit, the loop included. The cache
holds ``KEYS`` entries (a tenth of its room), each looked up twice before the loop, so with
admission every hit is in the protected segment, where a steady hot key lives.
"""

from __future__ import annotations

import sys

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.memory import MemoryCache

KEYS = 1000


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 20_000
    admission = "--no-admission" not in argv
    cache = MemoryCache(KEYS * 10, 1 << 40, clock=lambda: 1000.0, admission=admission)
    keys = [CacheKey("minilm", "tenant", i.to_bytes(16, "little")) for i in range(KEYS)]
    for key in keys:
        cache.get(key)
        cache.set(key, Entry(b"x" * 1536, 1000.0, 1e9))
    for _ in range(2):
        for key in keys:
            assert cache.get(key) is not None
    get = cache.get
    for i in range(n):
        get(keys[i % KEYS])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
