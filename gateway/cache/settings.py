"""The cache sections of the gateway's settings: ``cache`` (the in-process tier), ``cache.node``
(the tier the worker processes of a host share) and ``redis``.

Frozen, keyword-only value objects that validate their own fields on construction (with the
checks of ``gateway/validation.py``); the gateway's settings loader builds them from the
config
file, flags and ``GATEWAY_CACHE_*`` / ``GATEWAY_REDIS_*`` environment variables, and
``create_app`` hands them to ``MemoryCache`` and ``RedisCache`` as they are. Each field's
docstring is its reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gateway import validation as check
from gateway.validation import SettingsError

MiB = 1024 * 1024

#: URL schemes accepted for ``RedisSettings.url``; the ``+cluster`` forms select Redis Cluster.
_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
#: Glob characters are refused in the key prefix so purge patterns (SCAN MATCH) stay exact.
_PREFIX_FORBIDDEN = set("*?[]\\ \t\r\n")


EVICTIONS = ("sampled", "generations")


def default_node_path() -> str:
    """``$XDG_CACHE_HOME/edge-gateway/node``, else ``~/.cache/edge-gateway/node``: the root of
    the default directories, one per deployment below it."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return str(root / "edge-gateway" / "node")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCacheSettings:
    """The node tier (settings section ``cache.node``): one cache the worker processes of a
    host share, kept in a directory across restarts (gateway/cache/node.py)."""

    enabled: bool = True
    """Share one cache between this host's workers and keep it across restarts. Off: each
    worker has only its in-process cache (and Redis, when set)."""
    path: str | None = None
    """Directory of the LMDB files, created if missing. Unset: one per deployment,
    ``$XDG_CACHE_HOME/edge-gateway/node/<deployment tag>`` (``~/.cache`` without it). Every
    worker and every restart of this deployment pointing at it shares its entries; another
    deployment pointed at it never reads them (gateway/cache/deployment.py)."""
    deployment: str | None = None
    """This deployment's name: node entries are scoped by it (and by each model's identity).
    Unset: derived from the tenants file's API-key-to-tenant mapping at start-up, so it changes
    (entries start cold) when keys are added or moved; set it to keep them. Gateways sharing a
    name and a directory share entries: give each deployment its own."""
    max_bytes: int = 512 * MiB
    """Largest size of the data file (the memory map). Sampled eviction: entries' keys and
    values fill up to (0.875 x this - 512 KiB) / 2 (B-tree pages are about half full; the rest is
    LMDB's working room); generations: a bit under half of it in each of two."""
    ttl_s: float = 86_400.0
    """Longest any entry lives in this tier, whatever its own TTL."""
    admission: bool = True
    """Frequency-aware admission (gateway/cache/nodeadmit.py): once the tier is full a new key
    is written only if asked for more often lately than the entry it would evict, counted
    in a sketch every worker of the host shares. Off: every answer is written."""
    eviction: str = "sampled"
    """How the tier makes room: ``sampled`` (one LMDB database; a new entry evicts one picked at
    random, and with ``admission`` is written only if asked for more often lately than it;
    gateway/cache/nodesampled.py) or ``generations`` (two rotating generations, the layout
    before 2026-12-05; gateway/cache/nodestore.py). Switching starts the directory empty."""

    write_delay_ms: float = 20.0
    """How long a miss's write to this tier waits for the writes of other misses, to share one
    LMDB transaction with them (the writer thread's Python, the page writes and the hand-offs
    of the interpreter lock are per transaction); another worker sees the entry that much
    later. 0: each write starts the writer on the event loop's next turn."""

    def directory(self, tag: str) -> str:
        """The directory to open: ``path``, else the default root + the deployment's tag."""
        return self.path if self.path is not None else str(Path(default_node_path()) / tag)

    def __post_init__(self) -> None:
        check.boolean("enabled", self.enabled)
        check.boolean("admission", self.admission)
        check.one_of("eviction", self.eviction, EVICTIONS)
        if self.path is not None:
            check.label("path", self.path)
        if self.deployment is not None:
            check.label("deployment", self.deployment)
        check.at_least("max_bytes", self.max_bytes, MiB)
        check.positive("ttl_s", self.ttl_s)
        check.between("write_delay_ms", self.write_delay_ms, 0.0, 1000.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSettings:
    """The cache trace recorder (settings section ``cache.trace``, gateway/cache/tracefile.py):
    key hashes, tenant hashes, answer sizes and times of every lookup, never text, for
    ``python -m bench hitratio --trace FILE`` to size the tiers from this traffic."""

    enabled: bool = False
    """Record. Each worker writes its own file: ``path`` with ``.<pid>`` appended."""
    path: str = "cache-trace.bin"
    """Where the records go (one file per worker process)."""
    max_bytes: int = 64 * MiB
    """Recording stops once a worker's file holds this much (29 bytes a lookup)."""
    max_seconds: float = 3600.0
    """Recording stops this long after the first record."""

    def __post_init__(self) -> None:
        check.boolean("enabled", self.enabled)
        check.label("path", self.path)
        check.at_least("max_bytes", self.max_bytes, 1024)
        check.positive("max_seconds", self.max_seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSettings:
    """The in-process LRU tier each worker process keeps (settings section ``cache``), and the
    node tier below it (``cache.node``)."""

    max_entries: int = 100_000
    """Most entries kept; the least recently used go first beyond it."""
    max_bytes: int = 256 * MiB
    """Most bytes kept (values, metadata and a fixed per-entry overhead)."""
    admission: bool = True
    """Frequency-aware admission (TinyLFU, gateway/cache/sketch.py): a new key enters a full L1
    only if asked for more often lately than the entry it would evict, so one-off scans do not
    flush what everybody repeats. Off: a plain LRU."""
    node: NodeCacheSettings = field(default_factory=NodeCacheSettings)
    """The cache this host's workers share (gateway/cache/node.py)."""
    trace: TraceSettings = field(default_factory=TraceSettings)
    """The trace recorder (off by default; docs/CACHE_SIZING.md)."""

    def __post_init__(self) -> None:
        check.at_least("max_entries", self.max_entries, 1)
        check.at_least("max_bytes", self.max_bytes, 1)
        check.boolean("admission", self.admission)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSettings:
    """The shared Redis tier, L2 (settings section ``redis``); off while ``url`` is unset."""

    url: str | None = None
    """``redis://[user:pass@]host:port/db``, ``rediss://`` for TLS, ``unix:///path``; the
    ``redis+cluster://`` / ``rediss+cluster://`` forms select Redis Cluster like ``cluster``.
    Unset: no Redis tier, the in-process cache only."""
    cluster: bool = False
    """Use the Redis Cluster client (slot-aware MGET, per-node SCAN); ``url`` is any seed."""
    timeout_s: float = 0.1
    """Budget for one command's reads and writes; past it the lookup is a miss and counts as a
    failure (never an error to the client)."""
    connect_timeout_s: float = 0.25
    """Budget for a TCP (+TLS) connect. A request-path operation never waits longer than
    ``timeout_s + connect_timeout_s`` in all."""
    failure_threshold: int = 3
    """Consecutive failures that open the circuit breaker (Redis is then skipped)."""
    open_s: float = 2.0
    """How long the breaker stays open before one probe is let through."""
    key_prefix: str = "gw:v1"
    """First part of every key (``{prefix}:{model}:{scope_tag}:{digest}``); bump its version
    when the stored format changes. No glob characters or whitespace."""
    max_connections: int = 64
    """Connection pool size; callers wait (within ``timeout_s``) when all are busy."""

    def __post_init__(self) -> None:
        if self.url is not None:
            if not isinstance(self.url, str) or not self.url:
                raise SettingsError("url: must be a Redis URL such as redis://127.0.0.1:6379/0 "
                                    "(leave it unset for no Redis tier)")
            scheme = urlsplit(self.url).scheme
            if scheme not in _SCHEMES:
                raise SettingsError(f"url: the scheme must be one of {', '.join(_SCHEMES)} "
                                    f"(got {scheme or 'none'!r})")
        check.boolean("cluster", self.cluster)
        check.positive("timeout_s", self.timeout_s, upper=30.0)
        check.positive("connect_timeout_s", self.connect_timeout_s, upper=60.0)
        check.at_least("failure_threshold", self.failure_threshold, 1)
        check.positive("open_s", self.open_s, upper=3600.0)
        if (not isinstance(self.key_prefix, str) or not self.key_prefix
                or _PREFIX_FORBIDDEN & set(self.key_prefix)):
            raise SettingsError(
                "key_prefix: must be non-empty, without whitespace or any of * ? [ ] \\ "
                f"(got {self.key_prefix!r})"
            )
        check.at_least("max_connections", self.max_connections, 1)

    @property
    def is_cluster(self) -> bool:
        """True when ``cluster`` is set or the URL scheme says ``+cluster``."""
        return self.cluster or urlsplit(self.url or "").scheme.endswith("+cluster")

    @property
    def client_url(self) -> str:
        """The URL as redis-py expects it (the ``+cluster`` marker removed)."""
        if self.url is None:
            raise SettingsError("url: not set, so there is no Redis tier to connect to")
        parts = urlsplit(self.url)
        if parts.scheme.endswith("+cluster"):
            parts = parts._replace(scheme=parts.scheme.removesuffix("+cluster"))
        return urlunsplit(parts)

    def __repr__(self) -> str:
        # The URL may carry a password; settings get logged at start-up.
        url = self.url
        parts = urlsplit(url or "")
        if url is not None and parts.password is not None:
            netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
            if parts.port is not None:
                netloc += f":{parts.port}"
            url = urlunsplit(parts._replace(netloc=netloc))
        return (
            f"RedisSettings(url={url!r}, cluster={self.is_cluster}, timeout_s={self.timeout_s}, "
            f"connect_timeout_s={self.connect_timeout_s}, "
            f"failure_threshold={self.failure_threshold}, open_s={self.open_s}, "
            f"key_prefix={self.key_prefix!r}, max_connections={self.max_connections})"
        )
