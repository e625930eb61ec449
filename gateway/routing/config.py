"""Routing settings: where the backends are and how the gateway treats them.

Frozen, keyword-only value objects validated on construction; a bad value raises ``ValueError``
with a message that names the field, so start-up can stop with something a person can act on.
Each concern is configured under its own name, as Envoy does (health checks, outlier ejection,
locality, admission, retry, hedging).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.adaptive import AdaptiveSettings


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _label(name: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendSpec:
    """One backend: its base URL and its locality.

    Attributes:
        url: ``http://host:port`` (or https) of an OIP v2 server; a trailing slash is dropped.
        region: the backend's region; compared with the gateway's own to pick a tier.
        zone: the backend's zone within its region.
        name: a stable label for metrics and logs; defaults to ``host:port``.
    """

    url: str
    region: str = "local"
    zone: str = "local"
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise ValueError(f"backend url must be a string, got {self.url!r}")
        url = self.url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend url must look like http://host:port, got {self.url!r}")
        if parts.path or parts.query or parts.fragment:
            raise ValueError(f"backend url must have no path or query, got {self.url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"backend url has a bad port: {self.url!r}") from exc
        _label("backend region", self.region)
        _label("backend zone", self.zone)
        if self.name is not None:
            _label("backend name", self.name)
        object.__setattr__(self, "url", url)
        if self.name is None:
            object.__setattr__(self, "name", f"{parts.hostname}:{port}")

    @property
    def label(self) -> str:
        """The backend's name (always set after construction)."""
        return self.name or self.url


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingSettings:
    """How the gateway routes, checks, ejects, admits and retries.

    Attributes:
        region: the gateway's own region.
        zone: the gateway's own zone; backends in it form the nearest tier.
        health_interval_s: seconds between active health checks of each backend.
        health_timeout_s: timeout of one health-check request.
        unhealthy_threshold: failed checks in a row (timeouts, errors) before a backend is marked
            unhealthy; a refused connection or a 503 from the readiness route counts at once.
        eject_after_failures: consecutive failed calls before passive ejection.
        base_ejection_s: ejection time the first time; doubled on every repeat.
        max_ejection_s: cap on the ejection time.
        max_ejected_percent: at most this share of backends ejected at once; never all of them.
        ewma_alpha: weight of the newest latency sample in each backend's EWMA.
        max_inflight_per_backend: a backend with this many calls in flight counts as saturated and
            the balancer fails over to the next tier; ``None`` for no limit.
        connect_timeout_s: TCP connect timeout to a backend.
        read_timeout_s: longest time one backend call may take (the request deadline may cut it
            shorter).
        pool_size: keep-alive connection pool size, in total and per backend; keep it above
            ``tier_concurrency`` so health checks never wait behind traffic for a connection.
        retry: retry once on another backend after a connection failure or a backend 503.
        hedge_after_p95: after the tier's observed p95, send a second copy to another backend and
            take the first answer.
        hedge_min_samples: latency samples a tier needs before hedging starts.
        tier_concurrency: calls in flight per tier before requests queue; with ``adaptive``, the
            ceiling the adaptive limit moves under.
        tier_queue: requests that may wait per tier; more are shed at once (503).
        default_timeout_ms: deadline of a request that does not set ``X-Request-Timeout-Ms``.
        adaptive: an adaptive concurrency limit per tier (gateway/adaptive.py); None for the
            fixed ``tier_concurrency``.
        models: models whose versions the health checker reads from the backends.
    """

    region: str = "local"
    zone: str = "local"
    health_interval_s: float = 1.0
    health_timeout_s: float = 0.5
    unhealthy_threshold: int = 2
    eject_after_failures: int = 3
    base_ejection_s: float = 2.0
    max_ejection_s: float = 60.0
    max_ejected_percent: int = 50
    ewma_alpha: float = 0.3
    max_inflight_per_backend: int | None = None
    connect_timeout_s: float = 0.5
    read_timeout_s: float = 10.0
    pool_size: int = 100
    retry: bool = True
    hedge_after_p95: bool = False
    hedge_min_samples: int = 20
    tier_concurrency: int = 64
    tier_queue: int = 256
    default_timeout_ms: int = 10_000
    adaptive: AdaptiveSettings | None = None
    models: tuple[str, ...] = ("minilm",)

    def __post_init__(self) -> None:
        _label("region", self.region)
        _label("zone", self.zone)
        for name in ("health_interval_s", "health_timeout_s", "base_ejection_s",
                     "max_ejection_s", "connect_timeout_s", "read_timeout_s"):
            _positive(name, getattr(self, name))
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError(
                f"max_ejection_s ({self.max_ejection_s}) must be >= base_ejection_s "
                f"({self.base_ejection_s})"
            )
        _at_least("unhealthy_threshold", self.unhealthy_threshold, 1)
        _at_least("eject_after_failures", self.eject_after_failures, 1)
        _at_least("max_ejected_percent", self.max_ejected_percent, 0)
        if self.max_ejected_percent > 100:
            raise ValueError(
                f"max_ejected_percent must be between 0 and 100, got {self.max_ejected_percent}"
            )
        if not (isinstance(self.ewma_alpha, int | float) and 0 < self.ewma_alpha <= 1):
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha!r}")
        if self.max_inflight_per_backend is not None:
            _at_least("max_inflight_per_backend", self.max_inflight_per_backend, 1)
        _at_least("pool_size", self.pool_size, 1)
        _at_least("hedge_min_samples", self.hedge_min_samples, 1)
        _at_least("tier_concurrency", self.tier_concurrency, 1)
        _at_least("tier_queue", self.tier_queue, 0)
        _at_least("default_timeout_ms", self.default_timeout_ms, 1)
        if self.adaptive is not None and self.adaptive.min_limit > self.tier_concurrency:
            raise ValueError(
                f"tier_concurrency ({self.tier_concurrency}) must be >= the adaptive min_limit "
                f"({self.adaptive.min_limit})"
            )
        for name in ("retry", "hedge_after_p95"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.models, str) or not isinstance(self.models, tuple | list):
            raise ValueError(f"models must be a list of model names, got {self.models!r}")
        for model in self.models:
            _label("models[]", model)
        object.__setattr__(self, "models", tuple(self.models))
