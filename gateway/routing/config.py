"""Routing settings: where the backends are (``BackendSpec``) and how the gateway treats them
(``RoutingSettings``, the settings section ``routing``).

Frozen, keyword-only value objects that validate their own fields on construction (with the
checks of ``gateway/validation.py``): a bad value raises ``SettingsError`` naming the field, so
start-up stops with something a person can act on. Each concern is configured under its own
name, as Envoy does (locality, health checks, outlier ejection, retry, hedging); admission has
its own section (``gateway/admission.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway import validation as check
from gateway.validation import SettingsError


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendSpec:
    """One backend: its base URL and its locality (an item of the top-level ``backends``)."""

    url: str
    """``http://host:port`` (or https) of an OIP v2 server; a trailing slash is dropped."""
    region: str = "local"
    """The backend's region; compared with the gateway's own to pick a tier."""
    zone: str = "local"
    """The backend's zone within its region."""
    name: str | None = None
    """A stable label for metrics and logs; defaults to ``host:port``."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise SettingsError(f"url: must be a string (got {self.url!r})")
        url = self.url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"url: must look like http://host:port (got {self.url!r})")
        if parts.path or parts.query or parts.fragment:
            raise SettingsError(f"url: must have no path or query (got {self.url!r})")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise SettingsError(f"url: has a bad port (got {self.url!r})") from None
        check.label("region", self.region)
        check.label("zone", self.zone)
        if self.name is not None:
            check.label("name", self.name)
        object.__setattr__(self, "url", url)
        if self.name is None:
            object.__setattr__(self, "name", f"{parts.hostname}:{port}")

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        """The compact form flags and environment variables use: ``URL[@REGION[/ZONE]]`` (the
        zone defaults to the region, both to ``local``)."""
        url, _, where = text.strip().partition("@")
        region, _, zone = where.partition("/")
        return cls(url=url, region=region or "local", zone=zone or region or "local")

    @property
    def label(self) -> str:
        """The backend's name (always set after construction)."""
        return self.name or self.url


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingSettings:
    """How the gateway picks, checks, ejects, retries and hedges backends (section ``routing``).
    """

    region: str = "local"
    """The gateway's own region; backends in it form the nearer tiers."""
    zone: str = "local"
    """The gateway's own zone; backends in it form the nearest tier."""
    health_interval_s: float = 1.0
    """Seconds between active health checks of each backend."""
    health_timeout_s: float = 0.5
    """Timeout of one health-check request."""
    unhealthy_threshold: int = 2
    """Failed checks in a row (timeouts, errors) before a backend is marked unhealthy; a refused
    connection or a 503 from the readiness route counts at once."""
    eject_after_failures: int = 3
    """Consecutive failed calls before passive ejection."""
    base_ejection_s: float = 2.0
    """Ejection time the first time; doubled on every repeat."""
    max_ejection_s: float = 60.0
    """Cap on the ejection time."""
    max_ejected_percent: int = 50
    """At most this share of backends ejected at once; never all of them."""
    ewma_alpha: float = 0.3
    """Weight of the newest latency sample in each backend's EWMA."""
    max_inflight_per_backend: int | None = None
    """A backend with this many calls in flight counts as saturated and the balancer fails over
    to the next tier; unset for no limit."""
    connect_timeout_s: float = 0.5
    """TCP connect timeout to a backend (then 502, or a retry on another)."""
    read_timeout_s: float = 10.0
    """Longest time one backend call may take (the request deadline may cut it shorter)."""
    pool_size: int = 100
    """Keep-alive connections per process (the one client session's pool), in total and per
    backend; keep it above ``admission.tier_concurrency`` so health checks never wait behind
    traffic for a connection."""
    retry: bool = True
    """Retry once on another backend after a connection failure or a backend 503."""
    hedge_after_p95: bool = False
    """After the tier's observed p95, send a second copy to another backend and take the first
    answer."""
    hedge_min_samples: int = 20
    """Latency samples a tier needs before hedging starts."""

    def __post_init__(self) -> None:
        check.label("region", self.region)
        check.label("zone", self.zone)
        for name in ("health_interval_s", "health_timeout_s", "base_ejection_s",
                     "max_ejection_s", "connect_timeout_s", "read_timeout_s"):
            check.positive(name, getattr(self, name))
        if self.max_ejection_s < self.base_ejection_s:
            raise SettingsError(
                f"max_ejection_s: must be >= base_ejection_s ({self.base_ejection_s}) "
                f"(got {self.max_ejection_s})"
            )
        check.at_least("unhealthy_threshold", self.unhealthy_threshold, 1)
        check.at_least("eject_after_failures", self.eject_after_failures, 1)
        check.at_least("max_ejected_percent", self.max_ejected_percent, 0)
        check.between("max_ejected_percent", self.max_ejected_percent, 0, 100)
        check.between("ewma_alpha", self.ewma_alpha, 0, 1, open_low=True)
        if self.max_inflight_per_backend is not None:
            check.at_least("max_inflight_per_backend", self.max_inflight_per_backend, 1)
        check.at_least("pool_size", self.pool_size, 1)
        check.boolean("retry", self.retry)
        check.boolean("hedge_after_p95", self.hedge_after_p95)
        check.at_least("hedge_min_samples", self.hedge_min_samples, 1)
