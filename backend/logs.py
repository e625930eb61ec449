"""Structured logs: one JSON object per line on stderr.

Callers attach fields with ``extra={"fields": {...}}``. Nothing here ever sees request text:
handlers log ids, routes, sizes and timings only.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import Any, TextIO

import orjson

# One line per request, REST and gRPC alike (``write_access_line``).
access_log = logging.getLogger("backend.access")


class JsonFormatter(logging.Formatter):
    """Formats a record as ``{"ts", "level", "logger", "msg", **fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info and record.exc_info[0] is not None:
            # The exception's type and where it was raised, not its message (which may quote
            # input).
            entry["exc_type"] = record.exc_info[0].__name__
            entry["traceback"] = self.formatException(record.exc_info).splitlines()[-8:-1]
        return orjson.dumps(entry, default=str).decode()


def write_access_line(level: int, fields: dict[str, Any]) -> None:
    """One access-log line; the protocols call it after the answer has been handed over."""
    access_log.log(level, "request", extra={"fields": fields})


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Routes every logger (ours, aiohttp's) to JSON lines on ``stream`` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
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
