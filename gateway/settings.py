"""Typed, validated gateway settings.

Precedence, lowest first: field defaults, the YAML config file (``--config``), command-line flags,
then environment variables with the ``GATEWAY_`` prefix (``GATEWAY_REDIS_URL``,
``GATEWAY_ADMIN_TOKEN``, ``GATEWAY_BACKENDS=http://a:8001@eu-west/eu-west-1a,http://b:8001``...).
A bad value stops start-up with a message that names the setting.
"""

from __future__ import annotations

import dataclasses
import os
import types as types_
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_type_hints
from urllib.parse import urlsplit

import yaml

ENV_PREFIX = "GATEWAY_"


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names it and says what to fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendConfig:
    """One backend: its base URL and where it runs."""

    url: str
    region: str = "local"
    zone: str = "local"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"backends: {self.url!r} is not an http(s) URL with a host")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every gateway setting. Field docs are the reference (README lists them too)."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8080
    """Port to listen on."""
    workers: int = 0
    """Worker processes sharing the port (SO_REUSEPORT); 0 = one per core."""
    region: str = "local"
    """The gateway's own region (routing prefers backends here)."""
    zone: str = "local"
    """The gateway's own zone (routing prefers backends here first)."""
    backends: tuple[BackendConfig, ...] = ()
    """Backends: url, region, zone. At least one is required to serve."""
    models: tuple[str, ...] = ("minilm",)
    """Model names served (as the backends name them)."""
    model_aliases: Mapping[str, str] = field(
        default_factory=lambda: {
            "all-MiniLM-L6-v2": "minilm",
            "sentence-transformers/all-MiniLM-L6-v2": "minilm",
        }
    )
    """Other names clients may use for a model (OpenAI-style ids)."""
    redis_url: str | None = None
    """L2 cache (redis://, rediss://). None = the embedded in-process cache only."""
    redis_cluster: bool = False
    """Treat redis_url as a Redis Cluster seed."""
    redis_timeout_ms: float = 100.0
    """Per-operation Redis timeout; past it the lookup is a miss."""
    redis_key_prefix: str = "gw:v1"
    """Prefix of every Redis key this gateway writes."""
    l1_max_entries: int = 100_000
    """In-process cache bound by entries."""
    l1_max_bytes: int = 256 * 1024 * 1024
    """In-process cache bound by bytes."""
    policies: str | None = None
    """Policy file or folder; None = the built-in default policy."""
    shadow_policies: str | None = None
    """Candidate policy evaluated beside the active one (differences counted in metrics)."""
    policy_poll_s: float = 1.0
    """How often policy files are checked for changes."""
    tenants_file: str | None = None
    """API-key -> tenant file; None = every request is tenant 'public'."""
    admin_token: str | None = None
    """Bearer token for /admin routes; None disables them (404)."""
    metrics_token: str | None = None
    """Bearer token /metrics requires (its labels name tenants); None = open, as Prometheus
    scrapes by default."""
    max_body_bytes: int = 1024 * 1024
    """Largest request body accepted (413 past it)."""
    default_timeout_ms: int = 10_000
    """Deadline for requests without X-Request-Timeout-Ms."""
    max_timeout_ms: int = 60_000
    """Largest X-Request-Timeout-Ms honoured."""
    connect_timeout_ms: float = 500.0
    """Backend connect timeout."""
    read_timeout_ms: float = 10_000.0
    """Backend read timeout."""
    pool_size: int = 100
    """Keep-alive connections per process (the one client session's pool)."""
    health_interval_s: float = 1.0
    """Active health-check interval per backend."""
    eject_after_failures: int = 3
    """Passive ejection after this many consecutive failures."""
    tier_concurrency: int = 64
    """Backend calls in flight per locality tier before requests queue."""
    tier_queue: int = 256
    """Requests allowed to wait per tier; past it, 503 at once."""
    adaptive_concurrency: bool = False
    """Let each tier's limit follow backend latency (Envoy's gradient controller) under
    tier_concurrency."""
    adaptive_window_ms: float = 100.0
    """Adaptive limit: how often it is recomputed."""
    adaptive_percentile: float = 50.0
    """Adaptive limit: the latency percentile that stands for a window and for minRTT."""
    adaptive_buffer: float = 0.25
    """Adaptive limit: latency tolerated above minRTT, as a share of it, before the limit falls."""
    adaptive_min_limit: int = 3
    """Adaptive limit: its floor, and the limit while minRTT is measured."""
    adaptive_probe_interval_s: float = 30.0
    """Adaptive limit: time between minRTT measurements (plus up to 10% jitter)."""
    adaptive_probe_requests: int = 50
    """Adaptive limit: calls one minRTT measurement takes."""
    hedge: bool = False
    """Send a second copy to another backend after the tier's p95."""
    log_level: str = "INFO"
    """Log level (JSON lines on stderr)."""
    log_request_text: bool = False
    """Debug only: include request text in logs. Never enable in production."""

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SettingsError(f"port: {self.port} is not a TCP port (1-65535)")
        if self.workers < 0:
            raise SettingsError("workers: must be >= 0 (0 = one per core)")
        for name in ("l1_max_entries", "l1_max_bytes", "max_body_bytes", "default_timeout_ms",
                     "max_timeout_ms", "pool_size", "tier_concurrency", "eject_after_failures"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if self.tier_queue < 0:
            raise SettingsError("tier_queue: must be >= 0")
        for name in ("adaptive_window_ms", "adaptive_probe_interval_s", "adaptive_min_limit",
                     "adaptive_probe_requests"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if not 0 < self.adaptive_percentile <= 100:
            raise SettingsError(
                f"adaptive_percentile: must be in (0, 100] (got {self.adaptive_percentile})")
        if not 0 <= self.adaptive_buffer <= 10:
            raise SettingsError(
                f"adaptive_buffer: must be between 0 and 10 (got {self.adaptive_buffer})")
        if self.adaptive_concurrency and self.adaptive_min_limit > self.tier_concurrency:
            raise SettingsError(
                f"adaptive_min_limit: {self.adaptive_min_limit} is above tier_concurrency "
                f"({self.tier_concurrency}), the adaptive limit's ceiling")
        for name in ("redis_timeout_ms", "connect_timeout_ms", "read_timeout_ms",
                     "health_interval_s", "policy_poll_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if self.redis_url is not None:
            scheme = urlsplit(self.redis_url).scheme
            if scheme not in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
                raise SettingsError(
                    f"redis_url: scheme {scheme!r} is not redis://, rediss://, unix:// or "
                    "redis+cluster:// / rediss+cluster://"
                )
        token = self.metrics_token
        if token is not None and not (token.isascii() and token.isprintable()
                                      and token and " " not in token):
            raise SettingsError("metrics_token: must be non-empty printable ASCII without spaces "
                                "(leave it unset for an open /metrics)")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise SettingsError("log_level: one of DEBUG, INFO, WARNING, ERROR")
        if not self.models:
            raise SettingsError("models: at least one model name is required")
        for alias, target in self.model_aliases.items():
            if target not in self.models:
                raise SettingsError(f"model_aliases: {alias!r} points at unknown model {target!r}")

    def resolve_model(self, name: str) -> str | None:
        """The backend model name for what a client sent, or None when unknown."""
        if name in self.models:
            return name
        return self.model_aliases.get(name)


_FIELDS = {f.name for f in dataclasses.fields(Settings)}


def _parse_backend(item: object) -> BackendConfig:
    if isinstance(item, str):
        # "url" or "url@region/zone" (the compact form used by flags and env).
        url, _, where = item.partition("@")
        region, _, zone = where.partition("/")
        return BackendConfig(url=url, region=region or "local", zone=zone or region or "local")
    if isinstance(item, Mapping):
        unknown = set(item) - {"url", "region", "zone"}
        if unknown:
            raise SettingsError(f"backends: unknown keys {sorted(unknown)} (url, region, zone)")
        if "url" not in item:
            raise SettingsError("backends: each backend needs a url")
        return BackendConfig(**{k: str(v) for k, v in item.items()})
    raise SettingsError(f"backends: {item!r} is neither a URL nor a mapping")


def _coerce(name: str, value: object, hint: object) -> object:
    """Convert config/env/flag values to the field's type, with a message naming the field."""
    if name == "backends":
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise SettingsError("backends: expected a list")
        return tuple(_parse_backend(v) for v in value)
    if name == "models":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise SettingsError("models: expected a list of model names")
        return tuple(str(v) for v in value)
    if name == "model_aliases":
        if not isinstance(value, Mapping):
            raise SettingsError("model_aliases: expected a mapping of alias -> model")
        return {str(k): str(v) for k, v in value.items()}
    types = set(get_args(hint)) if isinstance(hint, types_.UnionType) else {hint}
    if value is None:
        if type(None) in types:
            return None
        raise SettingsError(f"{name}: a value is required")
    try:
        if bool in types:
            if isinstance(value, bool):
                return value
            low = str(value).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise SettingsError(f"{name}: {value!r} is not a boolean (true/false)")
        if int in types:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)  # type: ignore[call-overload]
        if float in types:
            if isinstance(value, bool):
                raise ValueError
            return float(value)  # type: ignore[arg-type]
        if str in types:
            if not isinstance(value, str | int | float):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        kind = next(t.__name__ for t in (bool, int, float, str) if t in types)
        raise SettingsError(f"{name}: {value!r} is not a valid {kind}") from None
    return value


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from the config file, then ``overrides`` (flags), then the environment."""
    raw: dict[str, object] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise SettingsError(f"config: cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise SettingsError(f"config: {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"config: {path} must hold a mapping of settings")
        raw.update(data)
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    env = os.environ if environ is None else environ
    for key, value in env.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):].lower()
            if name in _FIELDS:
                raw[name] = value
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(unknown)}")
    hints = get_type_hints(Settings)
    values = {name: _coerce(name, value, hints[name]) for name, value in raw.items()}
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise SettingsError(str(exc)) from None
