"""The request envelope shared by both protocols: content type, JSON body, headers.

Pure functions over header values and body bytes (no aiohttp), raising the backend's own
errors with messages a client can act on. Error messages never quote the body.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

from backend.errors import BadRequest, UnsupportedMediaType

# JSON, plus what standard OIP clients send for a JSON body: tritonclient's aiohttp client posts
# bytes as application/octet-stream, its gevent client sends no content type at all.
_ACCEPTED = {"application/json", "application/octet-stream", "text/json"}
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
MAX_TIMEOUT_MS = 600_000.0
MIN_TIMEOUT_MS = 1.0
"""Below a millisecond nothing can be answered in time: refused (400), not queued to a 504."""
# A JSON number without a sign, ASCII only: float() alone also takes "٣", "1_000" and "inf".
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def check_content_type(value: str | None) -> None:
    """Raises 415 unless the declared content type is JSON (or undeclared/raw bytes)."""
    if value is None or not value.strip():
        return
    mimetype = value.split(";", 1)[0].strip().lower()
    if mimetype in _ACCEPTED or mimetype.endswith("+json"):
        return
    raise UnsupportedMediaType(f"content type {mimetype!r} is not supported; send application/json")


def decode_json(body: bytes | memoryview) -> Any:
    """The parsed body; 400 with the reason when it is empty, not UTF-8 or not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            str(body, "utf-8")
        except UnicodeDecodeError as utf8:
            raise BadRequest(
                f"request body is not valid UTF-8 (invalid byte at offset {utf8.start})"
            ) from None
        if "surrogate" in str(exc):
            raise BadRequest(f"request body is not valid UTF-8: {exc}") from None
        raise BadRequest(f"malformed JSON: {exc}") from None


def whole(value: Any) -> int | None:
    """``value`` as an int when JSON Schema counts it an integer (``3`` and ``3.0``, not ``true``
    or ``3.5``), else None: a client that serialises every number as a float is not refused."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():  # False for inf and nan
        return int(value)
    return None


def timeout_from_header(value: str | None) -> float | None:
    """Seconds the request may take, from ``X-Request-Timeout-Ms`` (None: not given, so the
    priority level's default timeout applies)."""
    if value is None:
        return None
    ms = float(value) if _DECIMAL.fullmatch(value) else float("nan")
    if not MIN_TIMEOUT_MS <= ms <= MAX_TIMEOUT_MS:  # also rejects nan and inf
        raise BadRequest(
            f"X-Request-Timeout-Ms must be a number of milliseconds from {MIN_TIMEOUT_MS:g} "
            f"to {MAX_TIMEOUT_MS:.0f}"
        )
    return ms / 1000.0


def request_id(value: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a fresh one."""
    if value is not None and _REQUEST_ID.match(value):
        return value
    return os.urandom(16).hex()  # what uuid4().hex carries, at a third of the cost


def server_timing(queue_s: float, compute_s: float) -> str:
    """``Server-Timing`` header value: queue and compute durations in milliseconds."""
    return f"queue;dur={queue_s * 1000:.3f}, compute;dur={compute_s * 1000:.3f}"
