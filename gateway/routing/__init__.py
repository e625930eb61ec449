"""Routing: backend registry, health checks, outlier ejection and locality-tiered balancing.

Routing knows nothing of the cache; the request pipeline composes the two.
"""

from gateway.routing.backends import BackendState
from gateway.routing.balancer import TIER_ORDER, Outcome, Router, Tier
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.routing.health import HealthChecker

__all__ = [
    "TIER_ORDER",
    "BackendSpec",
    "BackendState",
    "HealthChecker",
    "Outcome",
    "Router",
    "RoutingSettings",
    "Tier",
]
