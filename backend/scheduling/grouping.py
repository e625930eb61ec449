"""Grouping items by size (token length) so that batches carry little padding.

Pure functions over item sizes, used by the batcher: which items form the next batch when more
are waiting than fit, and whether a batch of very mixed lengths runs better as a few calls.
Cost model: a call over items padded to the longest costs ``count * longest`` size units, plus a
fixed ``split_cost`` for the call itself (ONNX Runtime's per-call overhead, in the same units).
A call may also be capped at ``max_call_size`` padded units: on a CPU, one call over many long
texts does more work per text than a few smaller calls (see ``dataplane.CPU_CALL_TOKENS``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TypeVar

S = TypeVar("S")


def next_batch(waiting: list[S], sizes: Sequence[int], width: int) -> tuple[list[S], list[S]]:
    """Splits ``waiting`` (oldest first) into the next batch, sorted by size, and the rest
    (still oldest first). With a backlog the batch is the ``width`` items that hold the oldest
    and pad least, so nothing starves and like lengths travel together."""
    order = sorted(range(len(waiting)), key=lambda i: (sizes[i], i))
    if len(waiting) <= width:
        return [waiting[i] for i in order], []
    start = choose_window([sizes[i] for i in order], order.index(0), width)
    chosen = order[start : start + width]
    taken = set(chosen)
    return [waiting[i] for i in chosen], [w for i, w in enumerate(waiting) if i not in taken]


def choose_window(sizes: Sequence[int], must: int, width: int) -> int:
    """Start of the ``width``-long run of ascending ``sizes`` that holds index ``must`` and pads
    least (padding of a run = width * its largest size - its total size)."""
    prefix = [0, *itertools.accumulate(sizes)]
    best, best_cost = must, math.inf
    for start in range(max(0, must - width + 1), min(must, len(sizes) - width) + 1):
        cost = width * sizes[start + width - 1] - (prefix[start + width] - prefix[start])
        if cost < best_cost:
            best, best_cost = start, cost
    return best


def plan_groups(sizes: Sequence[int], split_cost: float, max_call_size: int | None = None
                ) -> list[tuple[int, int]]:
    """Cuts ascending ``sizes`` into ``(lo, hi)`` runs minimising padded work plus
    ``split_cost`` per run, then cuts any run whose padded size (count x longest) passes
    ``max_call_size`` into even runs under it (one item at least). Cuts are only tried where
    the power-of-two bucket changes, which keeps this a tiny dynamic programme whatever the
    batch size."""
    runs = _plan_runs(sizes, split_cost)
    if max_call_size is None:
        return runs
    capped: list[tuple[int, int]] = []
    for lo, hi in runs:
        per_call = max(1, max_call_size // sizes[hi - 1])
        calls = math.ceil((hi - lo) / per_call)
        edges = [lo + (hi - lo) * k // calls for k in range(calls + 1)]
        capped += list(itertools.pairwise(edges))
    return capped


def _plan_runs(sizes: Sequence[int], split_cost: float) -> list[tuple[int, int]]:
    n = len(sizes)
    if n == 0:
        return []
    cuts = [0, *(i for i in range(1, n) if sizes[i].bit_length() != sizes[i - 1].bit_length()), n]
    best = [0.0] + [math.inf] * (len(cuts) - 1)
    prev = [0] * len(cuts)
    for j in range(1, len(cuts)):
        for i in range(j):
            cost = best[i] + (cuts[j] - cuts[i]) * sizes[cuts[j] - 1] + split_cost
            if cost < best[j]:
                best[j], prev[j] = cost, i
    bounds: list[tuple[int, int]] = []
    j = len(cuts) - 1
    while j > 0:
        bounds.append((cuts[prev[j]], cuts[j]))
        j = prev[j]
    return bounds[::-1]
