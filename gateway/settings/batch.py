"""The ``batch`` settings section: limits of the Files/Batches API and how workers run lines.

Frozen and keyword-only like every section; each bound is checked here once. Environment:
``GATEWAY_BATCH_<FIELD>`` (``GATEWAY_BATCH_MAX_FILE_BYTES``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway import validation as check
from gateway.validation import SettingsError

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSettings:
    """Batch jobs (settings section ``batch``): OpenAI-style files and batches run on spare
    backend capacity by a worker in every gateway process. Needs Redis (``redis.url`` or
    ``redis_url`` here)."""

    enabled: bool = True
    """Serve the batch routes and run a worker in each process (when a Redis is set)."""
    redis_url: str | None = field(default=None, repr=False)  # may carry a password
    """The Redis that holds batch queues, state and files; unset: ``redis.url``. Give batches
    their own Redis with persistence (AOF) and ``noeviction`` when the cache Redis evicts."""
    storage_dir: str | None = None
    """Directory for file contents; unset: contents are kept in Redis with the metadata. Every
    gateway process sharing the batch Redis must use the same storage: the same directory (a
    shared volume across hosts), or none."""
    retention_s: float = 7 * 86_400.0
    """How long uploaded, output and error files and finished batches are kept."""
    max_file_bytes: int = 64 * MiB
    """Largest file accepted by ``POST /v1/files`` (413 past it)."""
    max_lines: int = 50_000
    """Most requests (non-blank lines) in one input file (413 past it)."""
    max_line_bytes: int = MiB
    """Largest single line of an input file (413 naming the line)."""
    max_active_batches: int = 4
    """Batches one tenant may have validating, in progress, finalizing or cancelling (429)."""
    max_stored_bytes: int = 1024 * MiB
    """Bytes of files (inputs and outputs) one tenant may keep stored (413 past it)."""
    chunk_lines: int = 16
    """Lines per queue entry: the unit a worker claims, acknowledges and takes over."""
    concurrency: int = 4
    """Lines each gateway process runs at once, at most (the gate may allow fewer)."""
    share: float = 0.5
    """Fraction of a tier's concurrency limit that batch lines may fill, and only while no
    interactive request waits in that tier's admission queue."""
    claim_idle_s: float = 30.0
    """A queue entry pending this long without a heartbeat is taken over by another worker
    (its worker died)."""
    retry_max_s: float = 5.0
    """Longest pause between tries of a line the backends shed or failed (it is retried, never
    failed for overload)."""

    def __post_init__(self) -> None:
        check.boolean("enabled", self.enabled)
        if self.redis_url is not None:
            scheme = urlsplit(self.redis_url).scheme if isinstance(self.redis_url, str) else ""
            if scheme not in ("redis", "rediss", "unix"):
                raise SettingsError(
                    "redis_url: must be a Redis URL such as redis://127.0.0.1:6379/1 "
                    f"(redis, rediss or unix; got {scheme or 'none'!r})")
        if self.storage_dir is not None:
            check.label("storage_dir", self.storage_dir)
        check.positive("retention_s", self.retention_s)
        check.at_least("max_file_bytes", self.max_file_bytes, 1024)
        check.at_least("max_lines", self.max_lines, 1)
        check.at_least("max_line_bytes", self.max_line_bytes, 256)
        check.at_least("max_active_batches", self.max_active_batches, 1)
        check.at_least("max_stored_bytes", self.max_stored_bytes, 1024)
        check.at_least("chunk_lines", self.chunk_lines, 1)
        check.at_least("concurrency", self.concurrency, 1)
        check.between("share", self.share, 0.0, 1.0, open_low=True)
        check.positive("claim_idle_s", self.claim_idle_s, upper=3600.0)
        check.positive("retry_max_s", self.retry_max_s, upper=600.0)
