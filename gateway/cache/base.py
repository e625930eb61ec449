"""The cache tier interface every tier implements (L1 in process, L2 Redis).

A tier stores opaque ``Entry`` values under ``CacheKey``s, in batches: the pipeline looks up every
item of a list input at once. Tiers know nothing of HTTP, policy or routing; deciding whether an
entry is fresh, stale or unusable is the caller's business (see ``Entry``).

Errors::

    CacheError
    ├── CacheCorrupt       stored bytes are not an entry (treated as a miss)   [entry.py]
    └── CacheUnavailable   an admin operation (purge) could not complete

Request-path operations (``get_many``, ``set_many``, ``delete_many``) never raise for a tier
being down or slow: they answer misses or do nothing. ``purge`` is an admin operation and raises
``CacheUnavailable`` rather than report a purge that did not happen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from gateway.cache.entry import CacheCorrupt, CacheError, Entry
from gateway.cache.keys import CacheKey

__all__ = ["CacheCorrupt", "CacheError", "CacheTier", "CacheUnavailable"]

class CacheUnavailable(CacheError):
    """A tier could not complete an admin operation (e.g. Redis down during a purge)."""


@runtime_checkable
class CacheTier(Protocol):
    """A bounded, expiring key-value store of entries, used in batches."""

    name: str

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Entry | None]:
        """One result per key, in order; ``None`` for a miss (or a tier that is down)."""
        ...

    async def set_many(self, items: Sequence[tuple[CacheKey, Entry]]) -> None:
        """Store each entry until its ``expires_at``."""
        ...

    async def delete_many(self, keys: Sequence[CacheKey]) -> int:
        """Remove these keys; returns how many existed."""
        ...

    async def purge(self, *, model: str | None = None, scope: str | None = None) -> int:
        """Remove every entry of ``model`` and/or ``scope`` (None = any); returns the count."""
        ...

    async def close(self) -> None:
        """Release connections; the tier is unusable afterwards."""
        ...
