"""Where the history's points are kept: in memory (one worker), or in files the host's workers
share (several workers, beside the Prometheus multiprocess files).

``MemoryRing`` is a bounded deque. ``FileRing`` adds JSON-lines segment files in one directory:
the sampling worker appends a line per point to the newest ``points.<seq>.jsonl`` and starts a
new segment every ``capacity // 2`` points, keeping the last three (so between one and 1.5
windows of points lie on disk, bounded). Every other worker mirrors the files into its own
deque, reading only the bytes appended since it last looked (a new segment makes it read the
kept ones again). A reader never sees a half-written line as a point: only lines ending in a
newline count, and a line that does not parse (a writer killed mid-line) is skipped.

``HostLock`` elects the sampling worker: a non-blocking ``flock`` on a file in the same
directory, which the kernel releases when its holder exits or dies, so another worker takes
over on its next tick. All file work here is blocking and meant to run off the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import orjson

from gateway.telemetry.history import Point

_SEGMENT = re.compile(r"^points\.(\d+)\.jsonl$")
_KEEP = 3


class MemoryRing:
    """The last ``capacity`` points, oldest first.

    Thread-safe: the sampler may append from a worker thread while the loop answers ``since``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._points: deque[Point] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, p: Point) -> None:
        with self._lock:
            self._points.append(p)

    def since(self, t: float) -> list[Point]:
        """Points newer than ``t`` (epoch seconds), oldest first."""
        with self._lock:
            if not self._points or self._points[-1]["t"] <= t:
                return []
            return [p for p in self._points if p["t"] > t]

    def replace(self, points: Iterable[Point]) -> None:
        with self._lock:
            self._points = deque(points, maxlen=self.capacity)

    def __len__(self) -> int:
        return len(self._points)


class FileRing(MemoryRing):
    """A ``MemoryRing`` mirrored to (writer) or from (readers) segment files in ``directory``."""

    def __init__(self, directory: Path, capacity: int) -> None:
        super().__init__(capacity)
        self.directory = directory
        self.segment_points = max(1, capacity // 2)
        directory.mkdir(parents=True, exist_ok=True)
        self._seq = -1        # the newest segment this process has read or written
        self._offset = 0      # bytes of it consumed
        self._lines = 0       # complete lines in it
        self._files = threading.Lock()  # one refresh or append at a time (threads of a worker)

    def _segments(self) -> list[int]:
        found = []
        for entry in os.scandir(self.directory):
            m = _SEGMENT.match(entry.name)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def _path(self, seq: int) -> Path:
        return self.directory / f"points.{seq}.jsonl"

    def refresh(self) -> None:
        """Bring the mirror up to date with the files (a reader's job; the writer calls it once
        when it takes over, so it continues the history rather than starting a new one)."""
        with self._files:
            self._refresh()

    def _refresh(self) -> None:
        segments = self._segments()
        if not segments:
            return
        newest = segments[-1]
        if newest != self._seq:
            points: list[Point] = []
            for seq in segments[-_KEEP:]:
                data = self._read(seq, 0)
                points.extend(_parse(data))
                if seq == newest:
                    self._offset = len(data)
                    self._lines = data.count(b"\n")
            self._seq = newest
            self.replace(points)
            return
        data = self._read(newest, self._offset)
        self._offset += len(data)
        self._lines += data.count(b"\n")
        for p in _parse(data):
            super().append(p)

    def _read(self, seq: int, offset: int) -> bytes:
        """The complete lines of segment ``seq`` from ``offset`` on (b"" if it is gone)."""
        try:
            with open(self._path(seq), "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        end = data.rfind(b"\n")
        return data[: end + 1] if end >= 0 else b""

    def append(self, p: Point) -> None:
        """Add a point (the writer only: the caller holds the ``HostLock``)."""
        with self._files:
            self._append(p)

    def _append(self, p: Point) -> None:
        if self._seq < 0 or self._lines >= self.segment_points:
            self._seq += 1
            self._offset = self._lines = 0
            for old in self._segments():
                if old <= self._seq - _KEEP:
                    with contextlib.suppress(FileNotFoundError):
                        self._path(old).unlink()
        line = orjson.dumps(p) + b"\n"
        with open(self._path(self._seq), "ab") as f:
            if f.tell() > self._offset:  # a previous writer died mid-line: end that line first
                line = b"\n" + line
                self._lines += 1
            f.write(line)
            self._offset = f.tell()
        self._lines += 1
        super().append(p)


def _parse(data: bytes) -> list[Point]:
    points = []
    for line in data.splitlines():
        try:
            p = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line cut short by a writer that died; the next one is whole
        if isinstance(p, dict) and isinstance(p.get("t"), int | float):
            points.append(p)
    return points


class HostLock:
    """One holder per host at a time: ``flock`` on ``path``, never waiting (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; True when this process holds it (now or already)."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())  # who samples, for people and tests
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """The pid of the worker that took the lock last (it may have died since)."""
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
