"""TinyLFU's frequency sketch: how often a key was asked for lately, in a few bytes per key.

A count-min sketch (Cormode and Muthukrishnan) of four rows of byte counters (``MAX_COUNT``), with a
doorkeeper and aging, as in TinyLFU (Einziger, Friedman and Manes, 2017) and Caffeine:
- ``increment(h)`` on every lookup. The first time a hash is seen only its doorkeeper slot is
  set: the one-off keys that make up most of a scan never reach the counters.
- ``estimate(h)`` is the smallest of its four counters, plus one if the doorkeeper saw it. Hash
  collisions only ever raise an estimate.
- Aging: after ``sample`` increments every counter is halved and the doorkeeper cleared, so the
  counts follow a popularity that shifts, and a key that was hot yesterday loses its place.

Counters are bytes in a buffer the caller may provide: a ``bytearray`` for the per-process L1,
or a shared memory map for the node tier (``nodeadmit.py``), where every worker of the host
counts into the same table. Across processes an increment is a read-modify-write without a
lock, so two workers touching one counter at the same instant may lose one count: a sketch is
approximate anyway, and a lock per lookup would cost more than the answer is worth.

``h`` is any well-mixed 64-bit integer (the L1 uses ``hash(key)``; the node tier 8 bytes of the
xxh3 digest, the same in every process). Row ``r`` reads bits ``16*r`` upwards, masked to the
width; the doorkeeper reads bits 24 upwards.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Counters saturate here. Caffeine stops at 15 (4 bits) and halves every 10 x entries lookups;
#: replayed here (bench hitratio), byte counters and a period twice as long rank a Zipf 0.6-0.8
#: popularity closer to the frequency oracle (0.62 -> 0.80 of it at 1%), at some cost when the
#: popular set moves (shift-0.8 at 5%: 1.03 -> 0.91 of the oracle).
MAX_COUNT = 255
ROWS = 4
#: Lookups between two halvings, per entry of the cache.
SAMPLE_FACTOR = 20
#: Counters per row, per entry of the cache: fewer collisions between the keys of one period.
WIDTH_FACTOR = 4


def table_width(entries: int) -> int:
    """Counters per row for a cache of ``entries``: a power of two, at least 64."""
    width = 64
    while width < entries * WIDTH_FACTOR:
        width <<= 1
    return width


def buffer_size(width: int) -> int:
    """Bytes a sketch of ``width`` needs (four rows plus the doorkeeper)."""
    return (ROWS + 1) * width


class FrequencySketch:
    """A count-min sketch with doorkeeper and aging (see the module docstring).

    ``entries`` is the capacity of the cache it serves (sizes the table and the aging period);
    ``buffer`` (``buffer_size(table_width(entries))`` writable bytes) holds the counters when
    they must live outside the process, else a fresh ``bytearray``.
    """

    __slots__ = ("_door", "_np", "_rows", "doorkeeper_mask", "mask", "sample", "size", "width")

    def __init__(self, entries: int, buffer: Any = None, *, sample: int | None = None) -> None:
        self.width = table_width(max(1, entries))
        self.mask = self.width - 1
        self.doorkeeper_mask = self.width - 1
        need = buffer_size(self.width)
        if buffer is None:
            buffer = bytearray(need)
        view = memoryview(buffer)
        if len(view) < need:
            raise ValueError(f"sketch buffer holds {len(view)} bytes, needs {need}")
        self._rows = view[: ROWS * self.width]
        self._door = view[ROWS * self.width : need]
        self._np: Any = np.frombuffer(view[:need], dtype=np.uint8)
        self.sample = sample if sample is not None else SAMPLE_FACTOR * max(1, entries)
        self.size = 0

    def increment(self, h: int) -> None:
        """Count one lookup of the key hashed to ``h``."""
        door = self._door
        d = (h >> 24) & self.doorkeeper_mask
        if not door[d]:
            door[d] = 1
        else:
            t = self._rows
            m = self.mask
            w = self.width
            # Four rows unrolled: this runs on every L1 lookup.
            i = h & m
            v = t[i]
            if v < MAX_COUNT:
                t[i] = v + 1
            i = w + ((h >> 16) & m)
            v = t[i]
            if v < MAX_COUNT:
                t[i] = v + 1
            i = 2 * w + ((h >> 32) & m)
            v = t[i]
            if v < MAX_COUNT:
                t[i] = v + 1
            i = 3 * w + ((h >> 48) & m)
            v = t[i]
            if v < MAX_COUNT:
                t[i] = v + 1
        self.size += 1
        if self.size >= self.sample:
            self.age()

    def estimate(self, h: int) -> int:
        """How often the key hashed to ``h`` was counted lately (never less than the truth,
        up to ``MAX_COUNT + 1``)."""
        t = self._rows
        m = self.mask
        w = self.width
        count = min(t[h & m], t[w + ((h >> 16) & m)], t[2 * w + ((h >> 32) & m)],
                    t[3 * w + ((h >> 48) & m)])
        return count + self._door[(h >> 24) & self.doorkeeper_mask]

    def age(self) -> None:
        """Halve every counter and clear the doorkeeper (one vectorised pass)."""
        rows = self._np[: ROWS * self.width]
        rows >>= 1
        self._np[ROWS * self.width :] = 0
        self.size //= 2

    def clear(self) -> None:
        self._np[:] = 0
        self.size = 0

    def release(self) -> None:
        """Let go of the buffer (a shared map can be closed after this); the sketch is dead."""
        self._np = None
        self._rows.release()
        self._door.release()
