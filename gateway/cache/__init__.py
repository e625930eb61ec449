"""The gateway's cache: a per-process LRU (L1), the node tier every worker of a host shares
(LMDB, kept across restarts), and an optional shared Redis (L2), composed by ``TieredCache``.

Keys come from ``gateway.cache.keys``; coalescing of in-flight misses from
``gateway.pipeline.singleflight``.
The cache knows nothing of HTTP, policy or routing: the request pipeline composes them.
"""

from gateway.cache.base import CacheTier, CacheUnavailable
from gateway.cache.breaker import BreakerState, CircuitBreaker
from gateway.cache.entry import CacheCorrupt, CacheError, Entry
from gateway.cache.memory import MemoryCache, MemoryStats
from gateway.cache.node import NodeCache, NodeStats, open_node_cache
from gateway.cache.redis import RedisCache
from gateway.cache.settings import CacheSettings, NodeCacheSettings, RedisSettings
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
    "NodeCache",
    "NodeCacheSettings",
    "NodeStats",
    "RedisCache",
    "RedisSettings",
    "TieredCache",
    "open_node_cache",
]
