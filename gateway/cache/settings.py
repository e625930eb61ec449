"""Typed, validated settings for the two cache tiers.

Both are frozen, keyword-only value objects. Validation raises ``ValueError`` naming the field and
what would be accepted, so a bad config file or environment variable stops start-up with a message
a person can act on. Environment overrides (``GATEWAY_`` prefix) are applied by the gateway's own
settings loader, which builds these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

MiB = 1024 * 1024

#: URL schemes accepted for ``RedisSettings.url``; the ``+cluster`` forms select Redis Cluster.
_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
#: Glob characters are refused in the key prefix so purge patterns (SCAN MATCH) stay exact.
_PREFIX_FORBIDDEN = set("*?[]\\ \t\r\n")


def _positive(name: str, value: float, *, upper: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be greater than 0, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}, got {value!r}")


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class L1Settings:
    """The in-process LRU tier.

    max_entries: most entries kept; the least recently used go first beyond it.
    max_bytes: most bytes kept (values + metadata + a fixed per-entry overhead).
    """

    max_entries: int = 100_000
    max_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        _positive_int("max_entries", self.max_entries)
        _positive_int("max_bytes", self.max_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSettings:
    """The shared Redis tier (L2).

    url: ``redis://[user:pass@]host:port/db``, ``rediss://`` for TLS, ``unix:///path``; the
        ``redis+cluster://`` / ``rediss+cluster://`` forms select Redis Cluster like ``cluster``.
    timeout_s: budget for one command's reads and writes; a slower Redis counts as a failure.
    connect_timeout_s: budget for a TCP (+TLS) connect. A request-path operation never waits
        longer than ``timeout_s + connect_timeout_s`` in all.
    failure_threshold: consecutive failures that open the circuit breaker.
    open_s: how long the circuit stays open (Redis skipped) before one probe is let through.
    key_prefix: first part of every key (``{prefix}:{model}:{scope_tag}:{digest}``); bump its
        version when the stored format changes. No glob characters or whitespace.
    cluster: use the Redis Cluster client (slot-aware MGET, per-node SCAN).
    max_connections: connection pool size; callers wait (within the timeout) when all are busy.
    """

    url: str
    timeout_s: float = 0.1
    connect_timeout_s: float = 0.25
    failure_threshold: int = 3
    open_s: float = 2.0
    key_prefix: str = "gw:v1"
    cluster: bool = False
    max_connections: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError("url must be a Redis URL such as redis://127.0.0.1:6379/0")
        scheme = urlsplit(self.url).scheme
        if scheme not in _SCHEMES:
            raise ValueError(
                f"url scheme must be one of {sorted(_SCHEMES)}, got {scheme or 'none'!r}"
            )
        _positive("timeout_s", self.timeout_s, upper=30.0)
        _positive("connect_timeout_s", self.connect_timeout_s, upper=60.0)
        _positive_int("failure_threshold", self.failure_threshold)
        _positive("open_s", self.open_s, upper=3600.0)
        _positive_int("max_connections", self.max_connections)
        if not isinstance(self.cluster, bool):
            raise ValueError(f"cluster must be true or false, got {self.cluster!r}")
        if not self.key_prefix or _PREFIX_FORBIDDEN & set(self.key_prefix):
            raise ValueError(
                "key_prefix must be non-empty, without whitespace or any of * ? [ ] \\, "
                f"got {self.key_prefix!r}"
            )

    @property
    def is_cluster(self) -> bool:
        """True when ``cluster`` is set or the URL scheme says ``+cluster``."""
        return self.cluster or urlsplit(self.url).scheme.endswith("+cluster")

    @property
    def client_url(self) -> str:
        """The URL as redis-py expects it (the ``+cluster`` marker removed)."""
        parts = urlsplit(self.url)
        if parts.scheme.endswith("+cluster"):
            parts = parts._replace(scheme=parts.scheme.removesuffix("+cluster"))
        return urlunsplit(parts)

    def __repr__(self) -> str:
        # The URL may carry a password; settings get logged at start-up.
        parts = urlsplit(self.url)
        url = self.url
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
            if parts.port is not None:
                netloc += f":{parts.port}"
            url = urlunsplit(parts._replace(netloc=netloc))
        return (
            f"RedisSettings(url={url!r}, timeout_s={self.timeout_s}, "
            f"connect_timeout_s={self.connect_timeout_s}, "
            f"failure_threshold={self.failure_threshold}, open_s={self.open_s}, "
            f"key_prefix={self.key_prefix!r}, cluster={self.is_cluster}, "
            f"max_connections={self.max_connections})"
        )
