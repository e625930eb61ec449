"""File contents in a directory (``batch.storage_dir``): write, append, read, delete, the
retention sweep, and ids that could leave the directory refused."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gateway.batch.blobs import DirBlobs
from gateway.batch.keys import new_file_id, output_file_id


async def test_put_append_get_delete_and_sweep(tmp_path: Path) -> None:
    blobs = DirBlobs(str(tmp_path / "files"))
    first, out = new_file_id(), output_file_id("batch_" + "0" * 24, "output")
    await blobs.put(first, b"line 1\n", 60.0)
    await blobs.put(out, b"", 60.0)
    await blobs.append(out, b"a\n", 60.0)
    await blobs.append(out, b"b\n", 60.0)
    assert await blobs.get(first) == b"line 1\n" and await blobs.get(out) == b"a\nb\n"
    old = time.time() - 3600
    os.utime(tmp_path / "files" / first, (old, old))
    assert await blobs.sweep(60.0) == 1  # only the file past the retention
    assert await blobs.get(first) is None and await blobs.get(out) == b"a\nb\n"
    await blobs.delete(out)
    await blobs.delete(out)  # absent is fine
    assert await blobs.get(out) is None


@pytest.mark.parametrize("file_id", ["../escape", "file-../../x", "/etc/passwd", "file-ABC"])
async def test_ids_that_are_not_file_ids_never_become_paths(tmp_path: Path, file_id: str) -> None:
    blobs = DirBlobs(str(tmp_path))
    with pytest.raises(ValueError):
        await blobs.get(file_id)
