"""Routing: backend registry, outlier ejection and locality-tiered balancing.

Routing knows nothing of the cache; the request pipeline composes the two. Active health checks
call backends, so they live with the upstream client (gateway/upstream/health.py).
"""

from gateway.routing.backends import BackendState
from gateway.routing.balancer import TIER_ORDER, BackendResult, Router, Tier
from gateway.routing.config import BackendSpec, RoutingSettings

__all__ = [
    "TIER_ORDER",
    "BackendResult",
    "BackendSpec",
    "BackendState",
    "Router",
    "RoutingSettings",
    "Tier",
]
