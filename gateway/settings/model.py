"""The settings model: the top level (the HTTP server the handlers read) and its sections.

The sections that a component takes are defined beside it (``cache``, ``redis``: gateway/cache/
settings.py; ``routing``: gateway/routing/config.py; ``admission``:
gateway/upstream/admission/settings.py and its
``adaptive`` subsection: gateway/upstream/admission/adaptive.py; ``quotas``:
gateway/tenants/quota/settings.py); the two
that only ``create_app`` reads (``policies``, ``logging``) are here. The request limits and
tokens stay at the top level with the listen address: they are what the HTTP handlers read, and
``GATEWAY_PORT``, ``GATEWAY_ADMIN_TOKEN`` and ``GATEWAY_METRICS_TOKEN`` keep their names that
way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway import validation as check
from gateway.cache.settings import CacheSettings, RedisSettings
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.settings.batch import BatchSettings
from gateway.settings.connections import ConnectionSettings
from gateway.tenants.quota.settings import QuotaSettings
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.validation import SettingsError

MiB = 1024 * 1024
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ACCESS_LOG_MODES = ("all", "sampled", "errors", "off")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """Where the cache policies come from (section ``policies``)."""

    path: str | None = None
    """Policy file, or folder whose ``*.yaml`` files are read in name order; unset: the built-in
    default policy."""
    shadow_path: str | None = None
    """A candidate policy evaluated beside the active one; where they would decide differently
    is counted in metrics, by rule."""
    poll_interval_s: float = 1.0
    """How often the policy files are checked for changes (reloaded without a restart)."""

    def __post_init__(self) -> None:
        check.positive("poll_interval_s", self.poll_interval_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingSettings:
    """JSON log lines on stderr (section ``logging``)."""

    level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR (any case)."""
    request_text: bool = False
    """Debug only: include request text in log lines. Never enable it in production."""
    access_log: str = "all"
    """Per-request lines: all, sampled (a share of successes; every error and slow request),
    errors (errors and slow requests only) or off. Only written at level INFO or DEBUG."""
    access_log_sample: float = 0.01
    """The share of successful requests ``sampled`` writes (0 to 1)."""
    slow_ms: float = 1000.0
    """A request slower than this is always logged (sampled and errors modes)."""

    def __post_init__(self) -> None:
        level = self.level.upper() if isinstance(self.level, str) else self.level
        check.one_of("level", level, LOG_LEVELS)
        object.__setattr__(self, "level", level)
        check.boolean("request_text", self.request_text)
        check.one_of("access_log", self.access_log, ACCESS_LOG_MODES)
        check.between("access_log_sample", self.access_log_sample, 0.0, 1.0)
        check.positive("slow_ms", self.slow_ms)


def _default_aliases() -> dict[str, str]:
    return {"all-MiniLM-L6-v2": "minilm", "sentence-transformers/all-MiniLM-L6-v2": "minilm"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every gateway setting: the top-level fields, then one section per component.

    Each field's docstring is its reference; the README's table lists them by dotted name.
    """

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8080
    """Port to listen on."""
    workers: int = 0
    """Worker processes sharing the port (SO_REUSEPORT); 0 = one per core."""
    backends: tuple[BackendSpec, ...] = ()
    """Backends: ``{url, region, zone}`` each (flags and env: ``URL@REGION/ZONE``, comma-separated
    in env). At least one is required to serve."""
    models: tuple[str, ...] = ("minilm",)
    """Model names served (as the backends name them)."""
    model_aliases: Mapping[str, str] = field(default_factory=_default_aliases)
    """Other names clients may use for a model (OpenAI-style ids); env: ``ALIAS=MODEL,...``."""
    tenants_file: str | None = None
    """API key -> tenant file; unset: every request is tenant ``public``."""
    admin_token: str | None = field(default=None, repr=False)
    """Bearer token for the /admin routes; unset or empty: they do not exist (404)."""
    metrics_token: str | None = field(default=None, repr=False)
    """Bearer token /metrics requires (its labels name tenants); unset: open, as Prometheus
    scrapes by default."""
    max_body_bytes: int = MiB
    """Largest request body accepted (413 past it)."""
    default_timeout_ms: int = 10_000
    """Deadline of a request without ``X-Request-Timeout-Ms``."""
    max_timeout_ms: int = 60_000
    """Largest ``X-Request-Timeout-Ms`` honoured."""
    cache: CacheSettings = field(default_factory=CacheSettings)
    """The in-process cache tier."""
    redis: RedisSettings = field(default_factory=RedisSettings)
    """The shared Redis tier (off without ``redis.url``)."""
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    """Locality, health checks, ejection, timeouts, retries, hedging, the connection pool."""
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    """Concurrency limit and queue per locality tier, and the adaptive limit."""
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    """How the tenants file's quotas are enforced (Redis-shared, local fallback), what a cache
    hit costs, the tenant labels in metrics and the tenants file's reload."""
    policies: PolicySettings = field(default_factory=PolicySettings)
    """The cache policy files."""
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    """Log level and the request-text debug switch."""
    batch: BatchSettings = field(default_factory=BatchSettings)
    """Batch jobs (the Files and Batches API): limits, storage, and how workers run lines."""
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    """Client connections: head and body read deadlines, idle keep-alive, a cap per worker."""

    def __post_init__(self) -> None:
        check.label("host", self.host)
        if not isinstance(self.port, int) or isinstance(self.port, bool) \
                or not 0 < self.port < 65536:
            raise SettingsError(f"port: must be a TCP port, 1-65535 (got {self.port!r})")
        check.at_least("workers", self.workers, 0)
        object.__setattr__(self, "backends", tuple(self.backends))
        for i, backend in enumerate(self.backends):
            if not isinstance(backend, BackendSpec):
                raise SettingsError(f"backends[{i}]: must be a backend (got {backend!r})")
        if isinstance(self.models, str) or not isinstance(self.models, tuple | list):
            raise SettingsError(f"models: must be a list of model names (got {self.models!r})")
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models:
            raise SettingsError("models: at least one model name is required")
        for model in self.models:
            check.label("models", model)
        if not isinstance(self.model_aliases, Mapping):
            raise SettingsError(f"model_aliases: must map alias -> model "
                                f"(got {self.model_aliases!r})")
        for alias, target in self.model_aliases.items():
            if target not in self.models:
                raise SettingsError(f"model_aliases: {alias!r} points at unknown model "
                                    f"{target!r} (served: {', '.join(self.models)})")
        check.token("metrics_token", self.metrics_token, "for an open /metrics")
        check.at_least("max_body_bytes", self.max_body_bytes, 1)
        check.at_least("default_timeout_ms", self.default_timeout_ms, 1)
        check.at_least("max_timeout_ms", self.max_timeout_ms, 1)
        if self.default_timeout_ms > self.max_timeout_ms:
            raise SettingsError(f"default_timeout_ms: must be at most max_timeout_ms "
                                f"({self.max_timeout_ms}) (got {self.default_timeout_ms})")

    def require_backends(self) -> None:
        """Raises unless there is a backend to serve from (``policy check`` needs none)."""
        if not self.backends:
            raise SettingsError("backends: at least one backend is required "
                                "(--backend URL, GATEWAY_BACKENDS or backends: in --config)")

    def resolve_model(self, name: str) -> str | None:
        """The backend model name for what a client sent, or None when unknown."""
        if name in self.models:
            return name
        return self.model_aliases.get(name)
