"""The yardsticks of ``bench hitratio``: Belady's MIN, plain LRU and the frequency oracle.

Each takes a trace's ``keys`` (and ``sizes`` where bytes bound the cache) and returns a boolean
array, one hit flag per request, so hit ratios can be split by tenant or by stretch.

- ``belady``: Belady's MIN (1966), the offline optimum by entries: on a miss, keep the request's
  key only if it is asked again before some held key, and evict the held key asked again
  furthest in the future. With byte bounds it evicts by furthest next use until the new entry
  fits, which is the usual heuristic: the optimum with sizes is NP-hard.
- ``lru``: the textbook LRU, by entries or bytes.
- ``oracle``: holds the ``capacity`` keys asked most often in the whole trace, from their
  first request on (which is still a miss): the best an online cache can hope for when
  requests are independent draws.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

import numpy as np

NEVER = 1 << 62


def next_use(keys: np.ndarray) -> np.ndarray:
    """For each request, the index of the next request of the same key (``NEVER`` if none)."""
    out = np.full(len(keys), NEVER, dtype=np.int64)
    seen: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        k = int(keys[i])
        out[i] = seen.get(k, NEVER)
        seen[k] = i
    return out


def belady(keys: np.ndarray, capacity: int, *, sizes: np.ndarray | None = None,
           nxt: np.ndarray | None = None) -> np.ndarray:
    """Hit flags of Belady's MIN with ``capacity`` entries, or bytes when ``sizes`` is given."""
    nxt = next_use(keys) if nxt is None else nxt
    hits = np.zeros(len(keys), dtype=bool)
    held: dict[int, int] = {}  # key -> its next use (the heap may hold stale copies)
    weight: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (-next use, key)
    used = 0
    size_list = sizes.tolist() if sizes is not None else [1] * len(keys)
    for i, (k, n) in enumerate(zip(keys.tolist(), nxt.tolist(), strict=True)):
        if k in held:
            hits[i] = True
            if n == NEVER:  # its last request: the room is free from now on
                del held[k]
                used -= weight.pop(k)
                continue
        else:
            size = size_list[i]
            if n == NEVER or size > capacity:
                continue  # never asked again, or too big: MIN does not keep it
            weight[k] = size
            used += size
        held[k] = n
        heapq.heappush(heap, (-n, k))
        while used > capacity:
            neg, victim = heapq.heappop(heap)
            if held.get(victim) != -neg:
                continue  # a stale copy: the key was asked since
            del held[victim]
            used -= weight.pop(victim)
    return hits


def lru(keys: np.ndarray, capacity: int, *, sizes: np.ndarray | None = None) -> np.ndarray:
    """Hit flags of an LRU with ``capacity`` entries, or bytes when ``sizes`` is given."""
    hits = np.zeros(len(keys), dtype=bool)
    data: OrderedDict[int, int] = OrderedDict()
    used = 0
    size_list = sizes.tolist() if sizes is not None else None
    for i, k in enumerate(keys.tolist()):
        if k in data:
            data.move_to_end(k)
            hits[i] = True
            continue
        size = 1 if size_list is None else size_list[i]
        if size > capacity:
            continue
        data[k] = size
        used += size
        while used > capacity:
            used -= data.popitem(last=False)[1]
    return hits


def oracle(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Hit flags of the frequency oracle with ``capacity`` entries."""
    uniq, counts = np.unique(keys, return_counts=True)
    top = uniq[np.argsort(-counts, kind="stable")[:capacity]]
    kept = np.isin(keys, top)
    first = np.zeros(len(keys), dtype=bool)
    _, first_idx = np.unique(keys, return_index=True)
    first[first_idx] = True
    return kept & ~first
