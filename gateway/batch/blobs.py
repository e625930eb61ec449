"""Where file contents live: in Redis beside their metadata, or in a directory.

``Blobs`` is the interface (put, append, get, delete); ``RedisBlobs`` keeps each file as one
string key with the retention as its TTL; ``DirBlobs`` keeps each file as ``{dir}/{file_id}``
and removes files past the retention when ``sweep`` runs (the worker calls it now and then).
Directory I/O runs in a thread: nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis

from gateway.batch.keys import Keys, is_file_id


class Blobs(Protocol):
    """File contents by file id."""

    async def put(self, file_id: str, data: bytes, ttl_s: float) -> None:
        """Store (or replace) a file's contents."""

    async def append(self, file_id: str, data: bytes, ttl_s: float) -> None:
        """Add to a file's contents (the output files are written a page at a time)."""

    async def get(self, file_id: str) -> bytes | None:
        """A file's contents, or None when gone."""

    async def delete(self, file_id: str) -> None:
        """Remove a file's contents (absent is fine)."""

    async def sweep(self, retention_s: float) -> int:
        """Remove contents older than the retention; the number removed."""


class RedisBlobs:
    """Contents as Redis strings (``{p}:file:{id}:data``), expiring with their metadata."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        # redis-py types every reply as a union of all; here they are bytes (no decoding).
        self._redis: Any = redis
        self._keys = keys

    async def put(self, file_id: str, data: bytes, ttl_s: float) -> None:
        await self._redis.set(self._keys.blob(file_id), data, px=int(ttl_s * 1000))

    async def append(self, file_id: str, data: bytes, ttl_s: float) -> None:
        key = self._keys.blob(file_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.append(key, data)
            pipe.pexpire(key, int(ttl_s * 1000))
            await pipe.execute()

    async def get(self, file_id: str) -> bytes | None:
        value: bytes | None = await self._redis.get(self._keys.blob(file_id))
        return value

    async def delete(self, file_id: str) -> None:
        await self._redis.delete(self._keys.blob(file_id))

    async def sweep(self, retention_s: float) -> int:
        return 0  # Redis expires them


class DirBlobs:
    """Contents as files in one directory (``batch.storage_dir``), shared by the processes
    that serve batches."""

    def __init__(self, root: str) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)

    def _path(self, file_id: str) -> Path:
        if not is_file_id(file_id):  # ids become paths: never let one leave the directory
            raise ValueError("not a file id")
        return self._root / file_id

    async def put(self, file_id: str, data: bytes, ttl_s: float) -> None:
        path = self._path(file_id)

        def write() -> None:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

        await asyncio.to_thread(write)

    async def append(self, file_id: str, data: bytes, ttl_s: float) -> None:
        path = self._path(file_id)

        def add() -> None:
            with path.open("ab") as out:
                out.write(data)

        await asyncio.to_thread(add)

    async def get(self, file_id: str) -> bytes | None:
        path = self._path(file_id)

        def read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(read)

    async def delete(self, file_id: str) -> None:
        await asyncio.to_thread(self._path(file_id).unlink, missing_ok=True)

    async def sweep(self, retention_s: float) -> int:
        def run() -> int:
            cutoff = time.time() - retention_s
            removed = 0
            for path in self._root.iterdir():
                try:
                    if path.is_file() and path.stat().st_mtime < cutoff:
                        path.unlink(missing_ok=True)
                        removed += 1
                except OSError:
                    continue
            return removed

        return await asyncio.to_thread(run)
