"""The gateway's cache: an in-process LRU (L1) in front of an optional shared Redis (L2).

Keys come from ``gateway.keys``; coalescing of in-flight misses from ``gateway.singleflight``.
The cache knows nothing of HTTP, policy or routing: the request pipeline composes them.
"""

from gateway.cache.base import CacheTier, CacheUnavailable
from gateway.cache.breaker import BreakerState, CircuitBreaker
from gateway.cache.entry import CacheCorrupt, CacheError, Entry
from gateway.cache.memory import MemoryCache, MemoryStats
from gateway.cache.redis import RedisCache
from gateway.cache.settings import CacheSettings, RedisSettings
from gateway.cache.tiered import TieredCache

__all__ = [
    "BreakerState",
    "CacheCorrupt",
    "CacheError",
    "CacheSettings",
    "CacheTier",
    "CacheUnavailable",
    "CircuitBreaker",
    "Entry",
    "MemoryCache",
    "MemoryStats",
    "RedisCache",
    "RedisSettings",
    "TieredCache",
]
