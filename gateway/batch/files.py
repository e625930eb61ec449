"""Files: uploads, metadata, contents and the per-tenant stored-bytes quota.

A file belongs to the tenant that uploaded it (or to the batch's tenant, for output and error
files); a file id of another tenant is answered exactly as an unknown id (404), so ids say
nothing across tenants. Metadata lives in Redis (``{p}:file:{id}``), contents in ``Blobs``;
both expire after ``batch.retention_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.batch import scripts
from gateway.batch.blobs import Blobs
from gateway.batch.errors import Conflict
from gateway.batch.jsonl import check_upload
from gateway.batch.keys import Keys, is_file_id, new_file_id
from gateway.errors import NotFound, PayloadTooLarge
from gateway.settings.batch import BatchSettings

INPUT, OUTPUT = "batch", "batch_output"
READER = "reader:"
"""Prefix of a file hash's fields naming the batches that read it."""


@dataclass(frozen=True, slots=True)
class FileMeta:
    """One stored file's metadata."""

    id: str
    tenant: str
    filename: str
    purpose: str
    size: int
    lines: int
    created_at: int
    expires_at: int
    readers: tuple[str, ...] = ()
    """Batches that read it as their input, until each finishes (``reader:{batch_id}`` fields):
    it may not be deleted while one of them is unfinished."""

    def view(self) -> dict[str, Any]:
        """The OpenAI ``file`` object."""
        return {"id": self.id, "object": "file", "bytes": self.size,
                "created_at": self.created_at, "expires_at": self.expires_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None}

    @classmethod
    def from_hash(cls, file_id: str, raw: dict[bytes, bytes]) -> FileMeta:
        get = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(id=file_id, tenant=get["tenant"], filename=get["filename"],
                   purpose=get["purpose"], size=int(get["bytes"]), lines=int(get["lines"]),
                   created_at=int(get["created_at"]), expires_at=int(get["expires_at"]),
                   readers=tuple(k.removeprefix(READER) for k in get if k.startswith(READER)))


class FileStore:
    """Stores, finds and deletes a tenant's files."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, blobs: Blobs,
                 settings: BatchSettings, *, clock: Callable[[], float] = time.time) -> None:
        # redis-py types every reply as a union of all; here they are bytes (no decoding).
        self._redis: Any = redis
        self._keys = keys
        self.blobs = blobs
        self._settings = settings
        self._clock = clock
        self._reserve = redis.register_script(scripts.RESERVE_BYTES)

    async def upload(self, tenant: str, filename: str, data: bytes) -> FileMeta:
        """Check an input file and store it (413/422 when it breaks a limit)."""
        s = self._settings
        # Up to batch.max_lines JSON lines to parse: in a thread, not on the event loop.
        lines = await asyncio.to_thread(check_upload, data, max_lines=s.max_lines,
                                        max_line_bytes=s.max_line_bytes)
        return await self._store(tenant, new_file_id(), filename, INPUT, data, lines,
                                 limit=s.max_stored_bytes)

    async def _store(self, tenant: str, file_id: str, filename: str, purpose: str, data: bytes,
                     lines: int, *, limit: int) -> FileMeta:
        await self._count(tenant, file_id, len(data), limit)
        meta = self._meta(tenant, file_id, filename, purpose, len(data), lines)
        await self.blobs.put(file_id, data, self._settings.retention_s)
        await self._save(meta)
        return meta

    async def _count(self, tenant: str, file_id: str, size: int, limit: int) -> None:
        now = self._clock()
        used = int(await self._reserve(
            keys=[self._keys.tenant_files(tenant), self._keys.tenant_sizes(tenant)],
            args=[file_id, size, int(now + self._settings.retention_s), int(now), limit]))
        if used < 0:
            raise PayloadTooLarge(
                f"tenant storage limit: {-used - 1} bytes stored, this file adds {size}; "
                f"limit {limit} (batch.max_stored_bytes); delete files or wait for them to "
                "expire")

    def _meta(self, tenant: str, file_id: str, filename: str, purpose: str, size: int,
              lines: int) -> FileMeta:
        now = int(self._clock())
        return FileMeta(id=file_id, tenant=tenant, filename=filename, purpose=purpose,
                        size=size, lines=lines, created_at=now,
                        expires_at=now + int(self._settings.retention_s))

    async def _save(self, meta: FileMeta) -> None:
        key = self._keys.file(meta.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={
                "tenant": meta.tenant, "filename": meta.filename, "purpose": meta.purpose,
                "bytes": meta.size, "lines": meta.lines, "created_at": meta.created_at,
                "expires_at": meta.expires_at})
            pipe.pexpire(key, int(self._settings.retention_s * 1000))
            await pipe.execute()

    async def get(self, tenant: str, file_id: str) -> FileMeta:
        """The tenant's file, or 404 (also for another tenant's id)."""
        raw = await self._redis.hgetall(self._keys.file(file_id)) if is_file_id(file_id) else {}
        if not raw or raw.get(b"tenant", b"").decode() != tenant:
            raise NotFound(f"no file {file_id!r}")
        return FileMeta.from_hash(file_id, raw)

    async def content(self, tenant: str, file_id: str) -> bytes:
        await self.get(tenant, file_id)
        data = await self.blobs.get(file_id)
        if data is None:
            raise NotFound(f"no file {file_id!r}")
        return data

    async def delete(self, tenant: str, file_id: str, *, active: Callable[[str], Any]) -> None:
        """Delete the tenant's file; 409 while an unfinished batch reads it (``active(batch_id)``
        says whether that batch is still unfinished)."""
        meta = await self.get(tenant, file_id)
        for batch_id in meta.readers:
            if await active(batch_id):
                raise Conflict(f"file {file_id!r} is the input of batch {batch_id!r}, which has "
                               "not finished; cancel it first")
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.file(file_id))
            pipe.zrem(self._keys.tenant_files(tenant), file_id)
            pipe.hdel(self._keys.tenant_sizes(tenant), file_id)
            await pipe.execute()
        await self.blobs.delete(file_id)

    # -- output and error files, written a page at a time by the finalizer -----------------

    async def begin_output(self, file_id: str) -> None:
        await self.blobs.put(file_id, b"", self._settings.retention_s)

    async def append_output(self, file_id: str, page: bytes) -> None:
        await self.blobs.append(file_id, page, self._settings.retention_s)

    async def commit_output(self, tenant: str, file_id: str, filename: str, size: int,
                            lines: int) -> FileMeta:
        """Metadata for a finished output file; it counts toward the quota but is never
        refused (the work is done)."""
        await self._count(tenant, file_id, size, 0)
        meta = self._meta(tenant, file_id, filename, OUTPUT, size, lines)
        await self._save(meta)
        return meta
