"""The access log: one JSON line per request, built straight to bytes and written in batches.

Going through ``logging`` (a LogRecord, handler locks, the JSON formatter) cost more per cache
hit than the cache lookup itself. Here a request appends one tuple; every ``interval_s`` (or
when ``max_pending`` lines wait) they are rendered with orjson and written to the stream in one
call, off the request's path. The line has the same shape as every other log line (``ts``,
``level``, ``logger``, ``msg``) plus the request's fields; it never holds request text, header
values or query strings.

``mode``: ``all`` logs every request; ``sampled`` logs a share (``sample``) of successful
requests, and every error (status >= 400) and every slow request (over ``slow_ms``); ``errors``
logs errors and slow requests only; ``off`` logs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from typing import BinaryIO

import orjson

from gateway.tasks import stop_task

_LINE = (b'{"ts":"%s.%03dZ","level":"info","logger":"gateway.access","msg":"request",'
         b'"request_id":%s,"method":%s,"route":%s,"status":%d,"cache":%s,"tenant":%s,'
         b'"duration_ms":%.3f,"timing":%s}')
"""One access line; the same JSON an orjson dump of the fields would give (a test checks)."""
MODES = ("all", "sampled", "errors", "off")  # the logging.access_log setting


class AccessLog:
    """Buffered JSON access lines (see the module docstring)."""

    def __init__(self, stream: BinaryIO | None = None, *, mode: str = "all",
                 sample: float = 0.01, slow_ms: float = 1000.0, interval_s: float = 0.25,
                 max_pending: int = 512) -> None:
        if mode not in MODES:
            raise ValueError(f"access log mode must be one of {', '.join(MODES)}, got {mode!r}")
        self._stream = stream if stream is not None else sys.stderr.buffer
        self.mode = mode
        self.sample = sample
        self.slow_ms = slow_ms
        self.interval_s = interval_s
        self.max_pending = max_pending
        self._pending: list[tuple[float, str, str, str, int, str, str, float, str]] = []
        self._task: asyncio.Task[None] | None = None
        self._random = random.random

    def wanted(self, status: int, duration_ms: float) -> bool:
        mode = self.mode
        if mode == "all":
            return True
        if mode == "off":
            return False
        if status >= 400 or duration_ms >= self.slow_ms:
            return True
        return mode == "sampled" and self._random() < self.sample

    def record(self, request_id: str, method: str, route: str, status: int, cache: str,
               tenant: str, duration_ms: float, timing: str) -> None:
        """Queue one line (cheap: a tuple); written by the next flush."""
        if self.mode != "all" and not self.wanted(status, duration_ms):
            return
        pending = self._pending
        pending.append((time.time(), request_id, method, route, status, cache, tenant,
                        duration_ms, timing))
        if len(pending) >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Write every pending line in one call."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        lines = []
        second, stamp = -1, b""
        dumps = orjson.dumps  # every string field JSON-escaped; numbers formatted
        for ts, rid, method, route, status, cache, tenant, ms, timing in pending:
            if int(ts) != second:  # one strftime per second of lines, not per line
                second = int(ts)
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
            lines.append(_LINE % (stamp, int(ts % 1 * 1000), dumps(rid), dumps(method),
                                  dumps(route), status, dumps(cache), dumps(tenant), ms,
                                  dumps(timing)))
        lines.append(b"")
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr loses lines
            self._stream.write(b"\n".join(lines))
            self._stream.flush()

    def start(self) -> None:
        async def run() -> None:
            while True:
                await asyncio.sleep(self.interval_s)
                self.flush()

        self._task = asyncio.get_running_loop().create_task(run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        self.flush()
