"""Settings section ``quotas``: how the tenants file's quotas are enforced and reported.

The limits themselves are per tenant, in the tenants file (gateway/tenants/quota/spec.py); these are
the knobs around them. Redis is the ``redis`` section's (``redis.url``): with one, limits are
shared by every gateway process and host; without one, each process keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import validation as check


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaSettings:
    """Quota enforcement, tenant accounting and the tenants file's reload (section ``quotas``).
    """

    enabled: bool = True
    """Enforce the tenants file's quotas (false: count and report only, never 429)."""
    hit_cost: float = 0.0
    """Texts a cache hit is charged against ``texts_per_s`` and ``texts_per_day`` (0: hits are
    free, 1: they cost what a backend text costs); requests count against
    ``requests_per_s`` either way."""
    local_fraction: float = 1.0
    """Share of each limit one process enforces on its own while Redis is unreachable (or not
    configured): 1/N for N processes keeps the total near the limit."""
    top_tenants: int = 20
    """Tenants named in the per-tenant Prometheus labels (the busiest); the rest are
    ``other``, so the label's cardinality stays bounded."""
    poll_interval_s: float = 1.0
    """How often the tenants file is checked for changes (reloaded without a restart)."""

    def __post_init__(self) -> None:
        check.boolean("enabled", self.enabled)
        check.between("hit_cost", self.hit_cost, 0.0, 1.0)
        check.between("local_fraction", self.local_fraction, 0.0, 1.0, open_low=True)
        check.at_least("top_tenants", self.top_tenants, 1)
        check.positive("poll_interval_s", self.poll_interval_s)
