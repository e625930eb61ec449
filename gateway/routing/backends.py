"""What the gateway knows about each backend at run time.

``BackendState`` is plain mutable state owned by the ``Router`` (load, latency EWMA, outlier
counts, ejection, slow start) and the ``HealthChecker`` (health, model versions). It has
identity semantics: two states are the same backend only if they are the same object, so they
can live in sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.routing.coldstart import ColdStart
from gateway.routing.config import BackendSpec


@dataclass(eq=False, slots=True)
class BackendState:
    """One backend's live state.

    Attributes:
        spec: where it is and its locality.
        healthy: last verdict of the active health checks (optimistic until the first check).
        ejected_until: clock time until which outlier ejection keeps it out.
        consecutive_5xx: failed calls of any kind in a row since the last success.
        consecutive_gateway_failures: gateway failures (connection failures, resets, timeouts,
            502/504) in a row since the last call that was not one.
        interval_calls: calls that count for the success-rate check in this interval.
        interval_successes: of those, the successes.
        ejections: how many times it has been ejected.
        ejection_level: exponent of the next ejection time; decays after a quiet period.
        returned_at: clock time it came back (healthy again, or its ejection over), which
            starts its slow start; None when it never left.
        inflight: calls in flight now.
        ewma_s: latency EWMA in seconds; 0 until the first sample.
        samples: latency samples seen.
        health_failures: failed health checks in a row.
        model_versions: model name -> version, as the backend's metadata reports it.
        model_identities: model name -> the served graph's identity (its SHA-256), where the
            metadata reports one (``parameters.model_sha256``).
        cold_start: its first answers since it last became ready (coldstart.py).
    """

    spec: BackendSpec
    healthy: bool = True
    ejected_until: float = 0.0
    consecutive_5xx: int = 0
    consecutive_gateway_failures: int = 0
    interval_calls: int = 0
    interval_successes: int = 0
    ejections: int = 0
    ejection_level: int = 0
    returned_at: float | None = None
    inflight: int = 0
    ewma_s: float = 0.0
    samples: int = 0
    health_failures: int = 0
    model_versions: dict[str, str] = field(default_factory=dict)
    model_identities: dict[str, str] = field(default_factory=dict)
    cold_start: ColdStart = field(default_factory=ColdStart)
    name: str = field(init=False, default="")
    """The backend's label for metrics and logs (``spec.label``, kept: read several times
    per call)."""
    url: str = field(init=False, default="")
    """Base URL, without a trailing slash (``spec.url``)."""

    def __post_init__(self) -> None:
        self.name = self.spec.label
        self.url = self.spec.url

    def ejected(self, now: float) -> bool:
        """True while outlier ejection keeps this backend out."""
        return now < self.ejected_until

    def available(self, now: float) -> bool:
        """Healthy and not ejected: the balancer may send it traffic."""
        return self.healthy and not self.ejected(now)
