"""Routing settings: where the backends are (``BackendSpec``) and how the gateway treats them
(``RoutingSettings``, the settings section ``routing``).

Frozen, keyword-only value objects that validate their own fields on construction (with the
checks of ``gateway/validation.py``): a bad value raises ``SettingsError`` naming the
field, so
start-up stops with something a person can act on. Each concern is configured under its own
name, as Envoy does (locality, health checks, outlier ejection, retry, hedging); admission has
its own section (``gateway/upstream/admission/settings.py``).
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
    """``http://host:port`` (or https) of an OIP v2 REST server, or ``grpc://host:port`` of an
    OIP v2 gRPC one (``inference.GRPCInferenceService``: the backend's ``--grpc-port``); a
    trailing slash is dropped."""
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
        if parts.scheme not in ("http", "https", "grpc") or not parts.hostname:
            raise SettingsError(f"url: must look like http://host:port or grpc://host:port "
                                f"(got {self.url!r})")
        if parts.path or parts.query or parts.fragment:
            raise SettingsError(f"url: must have no path or query (got {self.url!r})")
        try:
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
        except ValueError:
            raise SettingsError(f"url: has a bad port (got {self.url!r})") from None
        if port is None:  # gRPC has no default port
            raise SettingsError(f"url: a grpc:// URL needs its port (got {self.url!r})")
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
    # Outlier detection (Envoy: the cluster's ``outlier_detection``).
    consecutive_5xx: int = 5
    """Consecutive failed calls of any kind (a 5xx answer other than 503, a malformed answer, a
    connection failure, a reset, a timeout) that eject a backend; 0 turns it off (Envoy's
    ``consecutive_5xx``). A 503 is the backend shedding load: it counts for neither."""
    consecutive_gateway_failure: int = 3
    """Consecutive gateway failures (connection failures, resets, timeouts, 502 and 504
    answers) that eject a backend; 0 turns it off (Envoy's ``consecutive_gateway_failure``)."""
    success_rate_minimum_hosts: int = 5
    """Hosts of a tier with ``success_rate_request_volume`` calls in an interval needed before
    the success-rate check runs in that tier; 0 turns the check off (Envoy's
    ``success_rate_minimum_hosts``)."""
    success_rate_request_volume: int = 100
    """Calls a host needs in one interval to take part in the success-rate check (Envoy's
    ``success_rate_request_volume``)."""
    success_rate_stdev_factor: int = 1900
    """A host whose success rate falls below ``mean - stdev x factor / 1000`` of its tier's
    hosts is ejected; 1900 means 1.9 standard deviations (Envoy's
    ``success_rate_stdev_factor``)."""
    outlier_interval_s: float = 10.0
    """Seconds between success-rate evaluations (Envoy's ``interval``)."""
    base_ejection_s: float = 2.0
    """Ejection time the first time; doubled on every repeat (Envoy's ``base_ejection_time``,
    which grows linearly there)."""
    max_ejection_s: float = 60.0
    """Cap on the ejection time (Envoy's ``max_ejection_time``)."""
    max_ejected_percent: int = 50
    """At most this share of backends ejected at once; never all of them (Envoy's
    ``max_ejection_percent``)."""
    # Slow start (Envoy: the load balancer's ``slow_start_config``).
    slow_start_window_s: float = 10.0
    """A backend that comes back (ejection over, or healthy again) gets a share of its tier's
    traffic that ramps up over this many seconds; 0 turns it off (Envoy's
    ``slow_start_window``). A backend alone in its tier takes the tier's traffic at once."""
    slow_start_aggression: float = 1.0
    """Shape of the ramp: the weight is ``(time since return / window) ** (1 / aggression)``;
    1 is linear, larger ramps faster at first (Envoy's ``aggression``)."""
    slow_start_min_weight_percent: int = 10
    """The weight a returning backend starts from, in percent (Envoy's
    ``min_weight_percent``)."""
    ewma_alpha: float = 0.3
    """Weight of the newest latency sample in each backend's EWMA."""
    backend_priority_interactive: int = 1
    """Backend scheduling priority (1 highest) of interactive calls, unless the tenants file
    says otherwise for the tenant or route (docs/SCHEDULING.md)."""
    backend_priority_batch: int = 3
    """Backend scheduling priority of batch-class calls and Batch API lines (the backend's
    lowest level by default; a number past its lowest is served at its lowest)."""
    fairness_salt: str = ""
    """Key of the hash that makes each tenant's fairness key (set it to keep tenant ids from
    being guessed from the keys a backend sees)."""
    max_inflight_per_backend: int | None = None
    """A backend with this many calls in flight counts as saturated and the balancer fails over
    to the next tier; unset for no limit."""
    connect_timeout_s: float = 0.5
    """TCP connect timeout to a backend (a connection failure: retried on another)."""
    read_timeout_s: float = 10.0
    """Longest time one backend call may take, when ``per_try_timeout_ms`` is unset (the request
    deadline may cut it shorter)."""
    pool_size: int = 100
    """Keep-alive connections per process (the one client session's pool), in total and per
    backend; keep it above ``admission.tier_concurrency`` so health checks never wait behind
    traffic for a connection."""
    http_client: str = "lean"
    """The client of ``http://`` backends: ``aiohttp`` (one pooled ``ClientSession``) or ``lean``
    (gateway/upstream/lean.py: an asyncio protocol per kept-alive connection and httptools'
    parser, fewer instructions per call). ``https://`` backends always use aiohttp."""
    # Retry policy (Envoy: the route's ``retry_policy`` and the cluster's ``retry_budget``).
    retry: bool = True
    """The retry policy's switch: false sends every request to one backend only."""
    retry_on: tuple[str, ...] = ("connect-failure", "reset", "retriable-status-codes")
    """What a retry is for, as Envoy's ``retry_on`` names it: ``connect-failure`` (refused,
    unreachable, connect timeout), ``reset`` (dropped before a complete answer, or no answer
    within the per-try timeout), ``retriable-status-codes`` (a status in
    ``retriable_status_codes``), ``gateway-error`` (502, 503, 504) and ``5xx`` (any 5xx). A 4xx
    is never retried."""
    retriable_status_codes: tuple[int, ...] = (500, 502, 503, 504)
    """The 5xx answers ``retriable-status-codes`` retries (Envoy's
    ``retriable_status_codes``)."""
    num_retries: int = 1
    """Retries per request, each on a backend not tried yet for it, nearest tier first (Envoy's
    ``num_retries``)."""
    per_try_timeout_ms: int | None = None
    """Time one try may take before it is abandoned and retried elsewhere (within the request's
    deadline); unset: ``read_timeout_s`` (Envoy's ``per_try_timeout``)."""
    retry_budget_percent: float = 20.0
    """Retries in flight at most this share of the requests in flight; a retry past it is not
    sent and the try's error is the answer (Envoy's ``retry_budget.budget_percent``)."""
    retry_budget_min_concurrency: int = 10
    """Retries in flight the budget allows however few requests are in flight (Envoy's
    ``retry_budget.min_retry_concurrency``, 3 there for a whole proxy; this budget is per worker
    and has to cover a host that dies with every call it had in flight)."""
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
        check.at_least("backend_priority_interactive", self.backend_priority_interactive, 1)
        check.at_least("backend_priority_batch", self.backend_priority_batch, 1)
        check.at_least("consecutive_5xx", self.consecutive_5xx, 0)
        check.at_least("consecutive_gateway_failure", self.consecutive_gateway_failure, 0)
        check.at_least("success_rate_minimum_hosts", self.success_rate_minimum_hosts, 0)
        check.at_least("success_rate_request_volume", self.success_rate_request_volume, 1)
        check.at_least("success_rate_stdev_factor", self.success_rate_stdev_factor, 0)
        check.positive("outlier_interval_s", self.outlier_interval_s)
        check.between("max_ejected_percent", self.max_ejected_percent, 0, 100)
        check.at_least("max_ejected_percent", self.max_ejected_percent, 0)
        check.between("slow_start_window_s", self.slow_start_window_s, 0, 3600)
        check.positive("slow_start_aggression", self.slow_start_aggression, upper=100)
        check.at_least("slow_start_min_weight_percent", self.slow_start_min_weight_percent, 1)
        check.between("slow_start_min_weight_percent", self.slow_start_min_weight_percent, 1, 100)
        check.between("ewma_alpha", self.ewma_alpha, 0, 1, open_low=True)
        if self.max_inflight_per_backend is not None:
            check.at_least("max_inflight_per_backend", self.max_inflight_per_backend, 1)
        check.at_least("pool_size", self.pool_size, 1)
        check.one_of("http_client", self.http_client, ("aiohttp", "lean"))
        check.boolean("retry", self.retry)
        object.__setattr__(self, "retry_on", _retry_on(self.retry_on))
        object.__setattr__(self, "retriable_status_codes",
                           _status_codes(self.retriable_status_codes))
        check.at_least("num_retries", self.num_retries, 0)
        if self.per_try_timeout_ms is not None:
            check.at_least("per_try_timeout_ms", self.per_try_timeout_ms, 1)
        check.between("retry_budget_percent", self.retry_budget_percent, 0, 100)
        check.at_least("retry_budget_min_concurrency", self.retry_budget_min_concurrency, 0)
        check.boolean("hedge_after_p95", self.hedge_after_p95)
        check.at_least("hedge_min_samples", self.hedge_min_samples, 1)

    @property
    def per_try_timeout_s(self) -> float:
        """The time one try may take: ``per_try_timeout_ms``, else ``read_timeout_s``."""
        if self.per_try_timeout_ms is None:
            return self.read_timeout_s
        return self.per_try_timeout_ms / 1000.0


RETRY_ON = ("connect-failure", "reset", "retriable-status-codes", "gateway-error", "5xx")
"""The ``retry_on`` conditions the gateway knows (Envoy's names for them)."""


def _retry_on(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise SettingsError(f"retry_on: must be a list of conditions (got {value!r})")
    for item in value:
        check.one_of("retry_on", item, RETRY_ON)
    return tuple(dict.fromkeys(value))


def _status_codes(value: object) -> tuple[int, ...]:
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise SettingsError(f"retriable_status_codes: must be a list of 5xx statuses "
                            f"(got {value!r})")
    for code in value:
        if not isinstance(code, int) or isinstance(code, bool) or not 500 <= code <= 599:
            raise SettingsError(f"retriable_status_codes: must be 5xx statuses: a 4xx is the "
                                f"request's fault and never retried (got {code!r})")
    return tuple(dict.fromkeys(value))
