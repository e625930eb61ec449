"""The input files a worker is reading, split into lines once and kept while they are in use.

A worker runs the lines of a few batches at a time; each chunk of a batch names its lines by
index, so the worker keeps the last few input files it read, parsed into ``(line number,
bytes)`` pairs, instead of fetching the file for every chunk.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from gateway.batch.blobs import Blobs
from gateway.batch.jsonl import Line, split_lines

_KEEP = 4


class InputFiles:
    """The last ``_KEEP`` input files read, as lines (one fetch per file at a time)."""

    def __init__(self, blobs: Blobs) -> None:
        self._blobs = blobs
        self._files: OrderedDict[str, list[Line]] = OrderedDict()
        self._loading: dict[str, asyncio.Future[list[Line] | None]] = {}

    async def lines(self, file_id: str) -> list[Line] | None:
        """The file's requests, or None when the file is gone."""
        found = self._files.get(file_id)
        if found is not None:
            self._files.move_to_end(file_id)
            return found
        pending = self._loading.get(file_id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[list[Line] | None] = asyncio.get_running_loop().create_future()
        self._loading[file_id] = fut
        try:
            data = await self._blobs.get(file_id)
            # A large file takes a while to split: not on the event loop.
            lines = await asyncio.to_thread(split_lines, data) if data is not None else None
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: a failed load with no other reader is not an error
            raise
        finally:
            self._loading.pop(file_id, None)
        fut.set_result(lines)
        if lines is not None:
            self._files[file_id] = lines
            while len(self._files) > _KEEP:
                self._files.popitem(last=False)
        return lines
