"""A cached answer and its compact, self-checking wire form (what L2 stores).

Layout, little-endian::

    magic "GWCE" | format u8 | checksum u64 | created_at f64 | ttl_s f64 | swr_s f64 | sie_s f64
    | compute_ms f64 | meta_len u32 | value_len u32 | meta | value

The checksum is xxh3_64 over everything after it. ``decode`` refuses anything short, foreign,
of another format version, truncated or altered with ``CacheCorrupt``, which callers treat as a
miss: a bad value in a shared Redis must never crash a request or be served.
"""

from __future__ import annotations

import math
import struct

import xxhash

MAGIC = b"GWCE"
FORMAT_VERSION = 1

_PRE = struct.Struct("<4sBQ")
_REST = struct.Struct("<5dII")
_HEADER = struct.Struct("<4sBQ5dII")
HEADER_SIZE = _HEADER.size
_checksum = xxhash.xxh3_64_intdigest


class CacheError(Exception):
    """Root of the cache's errors (defined here, the lowest module, to avoid import cycles)."""


class CacheCorrupt(CacheError):
    """Stored bytes are not a valid entry (garbage, truncated, foreign or of another format)."""


class Entry:
    """One cached answer: the value bytes plus the timing that decides fresh, stale or gone.

    Times are unix seconds (``time.time()``) so replicas sharing Redis agree on an entry's age.
    An entry is fresh for ``ttl_s``; after that it may still be served while the pipeline
    revalidates (``stale_while_revalidate_s``) or when the backend fails
    (``stale_if_error_s``). Tiers keep it until ``expires_at``. Treat instances as immutable.
    """

    __slots__ = (
        "compute_ms", "created_at", "expires_at", "meta", "stale_if_error_s",
        "stale_while_revalidate_s", "ttl_s", "value",
    )

    def __init__(
        self,
        value: bytes,
        created_at: float,
        ttl_s: float,
        stale_while_revalidate_s: float = 0.0,
        stale_if_error_s: float = 0.0,
        compute_ms: float = 0.0,
        meta: bytes = b"",
    ) -> None:
        self.value = value
        self.created_at = created_at
        self.ttl_s = ttl_s
        self.stale_while_revalidate_s = stale_while_revalidate_s
        self.stale_if_error_s = stale_if_error_s
        self.compute_ms = compute_ms
        self.meta = meta
        # Computed once: the L1 hit path compares it on every lookup.
        self.expires_at = created_at + ttl_s + max(stale_while_revalidate_s, stale_if_error_s)

    def age(self, now: float) -> float:
        """Seconds since the entry was created (never negative, whatever the clock skew)."""
        return max(0.0, now - self.created_at)

    # ``ttl_s``/``swr_s``/``sie_s`` arguments: the limits of the policy in force now. The
    # stricter of them and the entry's own apply, so a shortened TTL reaches entries already
    # stored (on every tier: they all hand entries to these checks) without rewriting them.

    def is_fresh(self, now: float, ttl_s: float = math.inf) -> bool:
        """Within its TTL (and ``ttl_s``): serve as a plain hit."""
        return now - self.created_at < min(self.ttl_s, ttl_s)

    def within_swr(self, now: float, ttl_s: float = math.inf, swr_s: float = math.inf) -> bool:
        """Expired, but inside the stale-while-revalidate window."""
        age = now - self.created_at
        ttl = min(self.ttl_s, ttl_s)
        return ttl <= age < ttl + min(self.stale_while_revalidate_s, swr_s)

    def within_sie(self, now: float, ttl_s: float = math.inf, sie_s: float = math.inf) -> bool:
        """Expired, but inside the stale-if-error window."""
        age = now - self.created_at
        ttl = min(self.ttl_s, ttl_s)
        return ttl <= age < ttl + min(self.stale_if_error_s, sie_s)

    def encode(self) -> bytes:
        """The wire form (see the module docstring)."""
        rest = _REST.pack(
            self.created_at, self.ttl_s, self.stale_while_revalidate_s, self.stale_if_error_s,
            self.compute_ms, len(self.meta), len(self.value),
        ) + self.meta + self.value
        return _PRE.pack(MAGIC, FORMAT_VERSION, _checksum(rest)) + rest

    @classmethod
    def decode(cls, data: bytes) -> Entry:
        """Parse ``encode``'s output; raises ``CacheCorrupt`` for anything else."""
        try:
            magic, version, checksum, created, ttl, swr, sie, compute_ms, meta_len, value_len = (
                _HEADER.unpack_from(data)
            )
        except struct.error:
            raise CacheCorrupt(f"entry too short: {len(data)} bytes") from None
        if magic != MAGIC:
            raise CacheCorrupt("entry has the wrong magic")
        if version != FORMAT_VERSION:
            raise CacheCorrupt(f"entry format version {version}, expected {FORMAT_VERSION}")
        if HEADER_SIZE + meta_len + value_len != len(data):
            raise CacheCorrupt("entry length does not match its header")
        # Slicing copies, yet beats a memoryview at these sizes.
        if _checksum(data[_PRE.size:]) != checksum:
            raise CacheCorrupt("entry checksum mismatch")
        # One isfinite on the sum: any inf or nan among the terms makes it non-finite.
        if not math.isfinite(created + ttl + swr + sie + compute_ms) or (
            ttl < 0 or swr < 0 or sie < 0
        ):
            raise CacheCorrupt("entry has invalid timing fields")
        meta_end = HEADER_SIZE + meta_len
        return cls(
            data[meta_end:], created, ttl, swr, sie, compute_ms, data[HEADER_SIZE:meta_end]
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (
            self.value == other.value and self.created_at == other.created_at
            and self.ttl_s == other.ttl_s
            and self.stale_while_revalidate_s == other.stale_while_revalidate_s
            and self.stale_if_error_s == other.stale_if_error_s
            and self.compute_ms == other.compute_ms and self.meta == other.meta
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value object: not hashable

    def __repr__(self) -> str:
        # Never the value itself: it is derived from request text.
        return (
            f"Entry(value=<{len(self.value)} bytes>, created_at={self.created_at}, "
            f"ttl_s={self.ttl_s}, swr_s={self.stale_while_revalidate_s}, "
            f"sie_s={self.stale_if_error_s}, compute_ms={self.compute_ms}, "
            f"meta=<{len(self.meta)} bytes>)"
        )
