"""Redis key names and object ids of the batch subsystem, in one place.

Keys carry ids and tenant ids only, never request text or API keys::

    {p}:queue                     STREAM  work entries: kind=lines (batch, start, count) or
                                          kind=finalize (batch); consumer group "workers"
    {p}:file:{file_id}            HASH    file metadata (tenant, filename, purpose, bytes,
                                          lines, created_at, expires_at); EXPIRE = retention
    {p}:file:{file_id}:data       STRING  file contents (unless batch.storage_dir is set)
    {p}:delayed                   ZSET    chunks over their tenant's quota, as
                                          "{batch}:{start}:{count}", scored by when they go
                                          back to the queue
    {p}:batch:{batch_id}          HASH    the batch object's fields and request counts
    {p}:batch:{batch_id}:results  HASH    line index -> "o" or "e" + the output/error JSONL line
                                          (HSETNX: the first answer for a line wins)
    {p}:batch:{batch_id}:finalizing STRING  the consumer finalizing it (SET NX PX): one at a time
    {p}:tenant:{tag}:files          ZSET    the tenant's file ids, scored by expiry time
    {p}:tenant:{tag}:sizes          HASH    file id -> bytes (the tenant's stored-bytes quota)
    {p}:tenant:{tag}:batches        ZSET    the tenant's batch ids, scored by creation (listing)
    {p}:tenant:{tag}:active         SET     the tenant's unfinished batch ids (its batch limit)
    {p}:active                    SET     every unfinished batch id (the status gauge)

``{p}`` is ``{redis.key_prefix}-batch``: a namespace of its own beside the cache's
``{redis.key_prefix}:{model}:...`` keys, so no model name, cache scan or purge ever meets it.
Tenant ids appear only as their scope tag (``{tag}``, ``gateway.cache.keys.scope_tag``), never in
clear.
"""

from __future__ import annotations

import re
import secrets

from gateway.cache.keys import scope_tag

GROUP = "workers"
"""The stream's consumer group: every gateway process is one consumer of it."""

_FILE_ID = re.compile(r"^file-[0-9a-f]{24}(-output|-errors)?$")
_BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def output_file_id(batch_id: str, kind: str) -> str:
    """The output (``kind="output"``) or error (``"errors"``) file of a batch: derived from the
    batch id, so a finalization that runs twice writes the same files."""
    return f"file-{batch_id.removeprefix('batch_')}-{kind}"


def is_file_id(value: str) -> bool:
    return bool(_FILE_ID.match(value))


def is_batch_id(value: str) -> bool:
    return bool(_BATCH_ID.match(value))


class Keys:
    """The key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}-batch"
        self.queue = f"{self.prefix}:queue"
        self.active = f"{self.prefix}:active"
        self.delayed = f"{self.prefix}:delayed"

    def file(self, file_id: str) -> str:
        return f"{self.prefix}:file:{file_id}"

    def blob(self, file_id: str) -> str:
        return f"{self.prefix}:file:{file_id}:data"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def results(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:results"

    def finalizing(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:finalizing"

    def tenant_files(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{scope_tag(tenant)}:files"

    def tenant_sizes(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{scope_tag(tenant)}:sizes"

    def tenant_batches(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{scope_tag(tenant)}:batches"

    def tenant_active(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{scope_tag(tenant)}:active"
