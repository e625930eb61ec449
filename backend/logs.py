"""Structured logs: one JSON object per line on stderr.

Callers attach fields with ``extra={"fields": {...}}``. Nothing here ever sees request text:
handlers log ids, routes, sizes and timings only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import sys
import time
from typing import Any, TextIO

import orjson

# One line per request, REST and gRPC alike (``write_access_line``).
access_log = logging.getLogger("backend.access")


def log_entry(created: float, level: str, logger: str, msg: str, fields: Any) -> dict[str, Any]:
    """One log line's object: ``{"ts", "level", "logger", "msg", **fields}``."""
    entry: dict[str, Any] = {
        "ts": dt.datetime.fromtimestamp(created, dt.UTC).isoformat(timespec="milliseconds"),
        "level": level.lower(),
        "logger": logger,
        "msg": msg,
    }
    if isinstance(fields, dict):
        entry.update(fields)
    return entry


class JsonFormatter(logging.Formatter):
    """Formats a record as ``{"ts", "level", "logger", "msg", **fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = log_entry(record.created, record.levelname, record.name, record.getMessage(),
                          getattr(record, "fields", None))
        if record.exc_info and record.exc_info[0] is not None:
            # The exception's type and where it was raised, not its message (which may quote
            # input).
            entry["exc_type"] = record.exc_info[0].__name__
            entry["traceback"] = self.formatException(record.exc_info).splitlines()[-8:-1]
        return orjson.dumps(entry, default=str).decode()


class AccessLines:
    """Access lines kept and written in one call every ``interval_s`` (or at ``max_pending``).

    Through ``logging`` each line cost a LogRecord, the handler's lock, the formatter and a
    write and flush of its own: about a third of what the event loop spent on a request beyond
    the bare server's. The lines are the ones ``JsonFormatter`` writes (``ts``, ``level``,
    ``logger``, ``msg``, then the fields), only late by up to ``interval_s``. They go to the
    stream ``configure_logging`` set up; where it was not called (an embedding app, tests
    with their own handlers), each line goes through ``logging`` as before.
    """

    def __init__(self, interval_s: float = 0.25, max_pending: int = 512) -> None:
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.stream: TextIO | None = None  # set by configure_logging
        self._pending: list[tuple[float, int, dict[str, Any]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def write(self, level: int, fields: dict[str, Any]) -> None:
        """Keeps one line (the caller checked that ``level`` is enabled)."""
        if self.stream is None:
            access_log.log(level, "request", extra={"fields": fields})
            return
        pending = self._pending
        pending.append((time.time(), level, fields))
        if len(pending) >= self.max_pending:
            self.flush()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to come back on: now
            self.flush()
            return
        if self._timer is None or self._loop is not loop:  # (a loop gone with its timer)
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._loop = loop.call_later(self.interval_s, self.flush), loop

    def flush(self) -> None:
        """Writes every kept line in one call."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        stream = self.stream
        if not self._pending or stream is None:  # (nothing is kept without a stream)
            return
        pending, self._pending = self._pending, []
        lines = [orjson.dumps(log_entry(created, logging.getLevelName(level), access_log.name,
                                        "request", fields), default=str).decode()
                 for created, level, fields in pending]
        lines.append("")
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr loses lines
            stream.write("\n".join(lines))
            stream.flush()


access_lines = AccessLines()


def write_access_line(level: int, fields: dict[str, Any]) -> None:
    """One access-log line; the protocols call it once the answer is handed over."""
    access_lines.write(level, fields)


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Routes every logger (ours, aiohttp's) to JSON lines on ``stream`` (stderr)."""
    access_lines.flush()
    access_lines.stream = stream or sys.stderr
    handler = logging.StreamHandler(access_lines.stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The lines never carry thread or process names: skip collecting them for every record.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
