"""Structured JSON log lines on stderr, one object per line, with the request id when known.

Request text never goes into a log line unless ``log_request_text`` (a debug setting) is on; the
pipeline only ever logs ids, routes, statuses, timings and error types.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

_STD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Render a record and its ``extra`` fields as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str = "INFO") -> None:
    # Skip what our JSON lines never print: caller frame lookup (a stack walk per record),
    # thread, process and multiprocessing names. Halves the access log's cost per request.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's own access log duplicates ours (and would print raw paths): keep it quiet.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
