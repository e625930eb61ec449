"""The host's recent history (``GET /dashboard/history.json``): one point a second, 15 minutes.

One worker per host samples: with several workers (Prometheus multiprocess mode) the worker
holding the ``HostLock`` in ``$PROMETHEUS_MULTIPROC_DIR/history/`` collects the multiprocess
files every second, turns two readings into a point (gateway/telemetry/history.py) and appends
it to the shared ``FileRing``; the others try the lock on every tick (a single non-blocking
``flock``, so a dead sampler is replaced within a second or two) and, when asked for points,
read what the sampler appended. Whichever worker answers the page therefore serves the same,
host-wide history. With one worker the registry is in-process: it samples it directly and keeps
the points in memory.

Collecting the multiprocess files and the file work run in a thread; the in-process registry is
collected on the event loop (it is in memory and has to be: its first collector flushes the
tally, which the loop owns). A new sampler starts from a fresh reading, so a takeover leaves a
gap of one interval; points already written stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.telemetry.history import Point, Reading, point
from gateway.telemetry.ring import FileRing, HostLock, MemoryRing
from gateway.telemetry.samples import Samples

log = logging.getLogger("gateway.history")

WINDOW_S = 900.0
"""How far back the history reaches (15 minutes)."""
INTERVAL_S = 1.0
"""One point per this many seconds."""


class History:
    """Samples the registry into a bounded history and answers for it (see the module)."""

    def __init__(
        self,
        collect: Callable[[], Samples],
        *,
        directory: Path | None = None,
        threaded: bool = False,
        window_s: float = WINDOW_S,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self.interval_s = interval_s
        capacity = max(2, round(window_s / interval_s))
        self._collect = collect
        self._threaded = threaded
        self._clock = clock
        self._ring: MemoryRing
        self._files: FileRing | None = None
        self._lock: HostLock | None = None
        if directory is None:
            self._ring = MemoryRing(capacity)
        else:
            self._ring = self._files = FileRing(directory, capacity)
            self._lock = HostLock(directory / "sampler.lock")
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    @classmethod
    def for_registry(cls, registry: CollectorRegistry, **options: Any) -> History:
        """The history of this gateway: shared by the host's workers in multiprocess mode."""
        mpdir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not mpdir:
            return cls(lambda: Samples(registry), **options)
        # Only the files, not the app's registry: that one's first collector flushes the
        # tally, which must not run off the loop. Each worker flushes its own every second.
        files = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(files, path=mpdir)  # type: ignore[no-untyped-call]
        return cls(lambda: Samples(files), directory=Path(mpdir) / "history", threaded=True,
                   **options)

    @property
    def sampling(self) -> bool:
        """Whether this worker is the one sampling."""
        return self._lock is None or self._lock.held

    def sampler_pid(self) -> int | None:
        """The process that samples for the host (the last one to take the lock)."""
        return os.getpid() if self._lock is None else self._lock.holder()

    async def points(self, since: float = 0.0) -> list[Point]:
        """Points newer than ``since`` (epoch seconds) inside the window, oldest first."""
        if self._files is not None and not self.sampling:
            await asyncio.to_thread(self._files.refresh)
        return self._ring.since(max(since, self._clock() - self.window_s))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._lock is not None:
            self._lock.release()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        before: Reading | None = None
        next_at = loop.time()
        while True:
            # On a fixed schedule (not "sleep an interval"), so points stay an interval apart;
            # a loop that fell behind skips ahead instead of sampling in a burst.
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())
            try:
                if not self.sampling and not await asyncio.to_thread(self._take_over):
                    before = None
                    continue
                before = await self._sample(before)
                self._failing = False
            except Exception:
                if not self._failing:  # once per failing stretch, not every second
                    log.warning("history sample failed", exc_info=True)
                self._failing = True
                before = None

    def _take_over(self) -> bool:
        if self._lock is None or self._files is None or not self._lock.try_acquire():
            return False
        self._files.refresh()  # continue the host's history, not start a new one
        log.info("sampling the host's history", extra={"pid": os.getpid()})
        return True

    async def _sample(self, before: Reading | None) -> Reading:
        if self._threaded:
            return await asyncio.to_thread(self._sample_now, before)
        return self._sample_now(before)

    def _sample_now(self, before: Reading | None) -> Reading:
        reading = Reading.of(self._collect(), time.monotonic())
        if before is not None:
            self._ring.append(point(before, reading, self._clock()))
        return reading
