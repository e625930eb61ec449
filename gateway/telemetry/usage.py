"""``TenantUsage``: what one answered request of a tenant used, as the Observer reports it.

Computed by the pipeline's accounting (gateway/pipeline/accounting.py) from the request's item
outcomes; defined here, below both, because telemetry only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What one answered request used (see the module docstring)."""

    backend_texts: int = 0
    cached_texts: int = 0
    coalesced_texts: int = 0
    tokens: int = 0
    compute_s: float = 0.0
    saved_s: float = 0.0
