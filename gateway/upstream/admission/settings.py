"""The settings section ``admission``: ``AdmissionSettings``, checked when loaded.

How many backend calls each locality tier lets through, how many may wait, and the adaptive
limit's settings (gateway/upstream/admission/adaptive.py); ``Admission`` (control.py) reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway import validation as check
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.validation import SettingsError


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionSettings:
    """How many backend calls each locality tier lets through, and how many wait (settings
    section ``admission``). Each worker process keeps its own counts."""

    tier_concurrency: int = 64
    """Backend calls in flight per tier before requests queue; with ``adaptive.enabled``, the
    ceiling the adaptive limit moves under."""
    tier_queue: int = 256
    """Requests that may wait per tier; more are shed at once (503 with Retry-After)."""
    adaptive: AdaptiveSettings = field(default_factory=AdaptiveSettings)
    """The adaptive concurrency limit per tier (gateway/upstream/admission/adaptive.py), off by
    default."""

    def __post_init__(self) -> None:
        check.at_least("tier_concurrency", self.tier_concurrency, 1)
        check.at_least("tier_queue", self.tier_queue, 0)
        if self.adaptive.enabled and self.adaptive.min_limit > self.tier_concurrency:
            raise SettingsError(
                f"adaptive.min_limit: must be at most tier_concurrency ({self.tier_concurrency}),"
                f" the adaptive limit's ceiling (got {self.adaptive.min_limit})")
