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


def timeout_from_header(value: str | None) -> float | None:
    """Seconds the request may take, from ``X-Request-Timeout-Ms`` (None: not given)."""
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        ms = float("nan")
    if not 0 < ms <= MAX_TIMEOUT_MS:  # also rejects nan and inf
        raise BadRequest(
            f"X-Request-Timeout-Ms must be a number of milliseconds in (0, {MAX_TIMEOUT_MS:.0f}]"
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
