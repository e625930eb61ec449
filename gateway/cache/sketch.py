"""TinyLFU's frequency sketch: how often a key was asked for lately, in a few bytes per key.

A count-min sketch (Cormode and Muthukrishnan) of four rows of byte counters (``MAX_COUNT``),
with a doorkeeper and aging, as in TinyLFU (Einziger, Friedman and Manes, 2017) and Caffeine:
- lookups are counted in batches: ``add``/``add_many`` queue a key's hash, and every
  ``batch`` of them is counted at once with numpy (``flush``). The L1 hit path then pays one
  list append per lookup instead of a dozen Python-level counter updates (callgrind:
  ``bench/RESULTS.md``); estimates lag the last batch, which is noise next to a period.
- The first time a hash is seen only its doorkeeper slot is set: the one-off keys that make
  up most of a scan never reach the counters.
- ``estimate(h)`` is the smallest of its four counters, plus one if the doorkeeper saw it. Hash
  collisions only ever raise an estimate.
- Aging: after ``sample`` lookups every counter is halved and the doorkeeper cleared, so the
  counts follow a popularity that shifts, and a key that was hot yesterday loses its place.

Counters are bytes in a buffer the caller may provide: a ``bytearray`` for the per-process L1,
or a shared memory map for the node tier (``nodeadmit.py``), where every worker of the host
counts into the same table. Across processes an update is a read-modify-write without a lock,
so two workers counting into one counter at the same instant may lose counts: a sketch is
approximate anyway, and a lock per batch would cost more than the answer is worth.

``h`` is any 64-bit integer with well-mixed bits (the L1 uses ``hash(key)``; the node tier 8
bytes of the xxh3 digest, the same in every process). Row ``r`` reads bits ``16*r`` upwards,
masked to the width; the doorkeeper reads bits 24 upwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: Counters saturate here. Caffeine stops at 15 (4 bits) and halves every 10 x entries lookups;
#: replayed here (bench hitratio, L1 at 1% / 5% of the keys), byte counters and a period 4x as
#: long rank a Zipf popularity closer to the frequency oracle (Zipf 0.8: 0.75 / 0.85 -> 0.92 /
#: 0.93 of it), at a cost when the popular set moves (shift-0.8: 1.16 / 1.03 -> 1.27 / 0.88).
MAX_COUNT = 255
ROWS = 4
#: Lookups between two halvings, per entry of the cache (10: 0.62 / 0.79 of the oracle on
#: Zipf 0.6 at 1% / 5%, 20: 0.72 / 0.84, 40: 0.77 / 0.85; shift-0.8 at 5%: 1.05, 0.97, 0.88).
#: The node tier's; the L1 chooses between 40 and 320 as its traffic shows (``miniature.py``).
SAMPLE_FACTOR = 40
#: Counters per row, per entry of the cache: fewer collisions between the keys of one period.
#: The node tier's default; the L1 asks for ``memory.SKETCH_WIDTH`` (16: a period of 40 lookups
#: per entry sees up to ~20 distinct keys per entry on Zipf 0.6; replayed, 4 -> 16 lifts the L1
#: from 0.84 / 0.83 to 0.88 / 0.88 of the oracle there at 1% / 5%, 32 and 64 no further).
WIDTH_FACTOR = 4
#: Lookups counted together, at most (fewer for small caches, whose periods are short).
BATCH = 256
_SHIFTS = [np.uint64(16 * r) for r in range(ROWS)]
_DOOR_SHIFT = np.uint64(24)


def table_width(entries: int, factor: int = WIDTH_FACTOR) -> int:
    """Counters per row for a cache of ``entries``: a power of two, at least 64, at least
    ``factor`` per entry."""
    width = 64
    while width < entries * factor:
        width <<= 1
    return width


def hashes_of(keys: Sequence[Any]) -> Any:
    """Each key's ``hash()``, as the ``uint64`` array ``FrequencySketch.count`` takes."""
    return np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)).view(np.uint64)


def buffer_size(width: int) -> int:
    """Bytes a sketch of ``width`` needs (the doorkeeper and four rows)."""
    return (ROWS + 1) * width


class FrequencySketch:
    """A count-min sketch with doorkeeper and aging (see the module docstring).

    ``entries`` is the capacity of the cache it serves (sizes the table and the aging period;
    ``width_factor`` counters per row per entry);
    ``buffer`` (``buffer_size(table_width(entries))`` writable bytes from ``offset``) holds
    the counters when they must live outside the process, else a fresh ``bytearray``.
    """

    def __init__(self, entries: int, buffer: Any = None, *, offset: int = 0,
                 sample: int | None = None, width_factor: int = WIDTH_FACTOR) -> None:
        self.width = table_width(max(1, entries), width_factor)
        self.mask = self.width - 1
        need = buffer_size(self.width)
        if buffer is None:
            buffer = bytearray(need)
        if len(buffer) - offset < need:
            raise ValueError(f"sketch buffer holds {len(buffer) - offset} bytes, needs {need}")
        self._all: Any = np.frombuffer(buffer, dtype=np.uint8, count=need, offset=offset)
        self._door: Any = self._all[: self.width]
        self._rows: Any = self._all[self.width :]
        # Scalar reads through a memoryview: an int per index, far cheaper than numpy's.
        self._view: Any = memoryview(buffer)[offset : offset + need]
        self.sample = sample if sample is not None else SAMPLE_FACTOR * max(1, entries)
        self.batch = max(1, min(BATCH, self.sample // 16))
        self.size = 0
        #: Hashes (or, for ``pending_keys``, keys) queued for the next ``flush``.
        self.pending: list[int] = []

    def add(self, h: int) -> None:
        """Count one lookup of the key hashed to ``h`` (at the next flush)."""
        self.pending.append(h)
        if len(self.pending) >= self.batch:
            self.flush()

    def add_many(self, hashes: Iterable[int]) -> None:
        self.pending.extend(hashes)
        if len(self.pending) >= self.batch:
            self.flush()

    def flush(self, hashes: list[Any] | None = None, *, hashed: bool = True) -> None:
        """Count the queued lookups (or ``hashes``; with ``hashed=False`` they are objects to
        ``hash()``), in one vectorised pass; then age if a period has passed."""
        batch = self.pending if hashes is None else hashes
        n = len(batch)
        if not n:
            return
        h = (np.fromiter(batch, dtype=np.int64, count=n).view(np.uint64) if hashed
             else hashes_of(batch))
        batch.clear()
        self.count(h)

    def count(self, h: Any) -> None:
        """Count the lookups of these hashes (a ``uint64`` array) in one vectorised pass; then
        age if a period has passed."""
        n = len(h)
        mask = np.uint64(self.mask)
        door = self._door
        d = ((h >> _DOOR_SHIFT) & mask).astype(np.intp)
        # The first sighting of a doorkeeper slot (before or within this batch) only sets it.
        _, first = np.unique(d, return_index=True)
        to_door = np.zeros(n, dtype=bool)
        to_door[first] = door[d[first]] == 0
        door[d[to_door]] = 1
        counted = h[~to_door]
        if len(counted):
            w = self.width
            idx = np.concatenate([((counted >> _SHIFTS[r]) & mask).astype(np.intp) + r * w
                                  for r in range(ROWS)])
            slots, adds = np.unique(idx, return_counts=True)
            rows = self._rows
            rows[slots] = np.minimum(rows[slots].astype(np.int32) + adds, MAX_COUNT)
        self.counted(n)

    def counted(self, n: int) -> None:
        """``n`` lookups were counted: age when a period has passed (overridable)."""
        self.size += n
        if self.size >= self.sample:
            self.age()

    def estimate(self, h: int) -> int:
        """How often the key hashed to ``h`` was counted lately (never less than the truth
        of the counted batches, up to ``MAX_COUNT + 1``)."""
        v = self._view
        m = self.mask
        w = self.width
        h &= 0xFFFFFFFFFFFFFFFF
        count = min(v[w + (h & m)], v[2 * w + ((h >> 16) & m)], v[3 * w + ((h >> 32) & m)],
                    v[4 * w + ((h >> 48) & m)])
        return int(count + v[(h >> 24) & m])

    def age(self) -> None:
        """Halve every counter and clear the doorkeeper (one vectorised pass)."""
        self._rows >>= 1
        self._door[:] = 0
        self.size //= 2

    def release(self) -> None:
        """Let go of the buffer (a shared map can be closed after this); the sketch is dead."""
        self._view.release()
        self._all = self._door = self._rows = None
