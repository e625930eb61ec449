"""Body parsing and schema checks shared by the handlers.

Order matters and is the contract: content type (415), size (413), JSON (400), schema (422).
Nothing here talks to a backend or a cache.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

from gateway.errors import (
    BadRequest,
    InvalidHeader,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)

MIN_TIMEOUT_MS = 1.0
"""The shortest deadline a client may ask for: below it no answer, not even a hit, could come
back in time, so the request is refused (400) rather than accepted to fail with a 504."""

# A JSON number without a sign, in ASCII only: float() alone would also take "٣", "1_000",
# " 5 ", "inf" and "nan".
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def deadline_ms(raw: str | None, *, default_ms: float, max_ms: float) -> float:
    """The request's ``X-Request-Timeout-Ms`` in milliseconds (``default_ms`` when absent);
    400 unless it is a plain number in [MIN_TIMEOUT_MS, max_ms]."""
    if raw is None:
        return default_ms
    value = float(raw) if _DECIMAL.fullmatch(raw) else math.nan
    if not MIN_TIMEOUT_MS <= value <= max_ms:  # also refuses nan and inf
        raise InvalidHeader(f"X-Request-Timeout-Ms: must be a number of milliseconds from "
                            f"{MIN_TIMEOUT_MS:g} to {max_ms:g}")
    return value


def timeout_ms_of(values: Iterable[str], *, default_ms: float, max_ms: float) -> float:
    """The request's timeout from every ``X-Request-Timeout-Ms`` it sent: each must be valid
    (400 otherwise, ``deadline_ms``) and the strictest applies; ``default_ms`` when none."""
    asked = [deadline_ms(raw, default_ms=default_ms, max_ms=max_ms) for raw in values]
    return min(asked) if asked else float(default_ms)


async def read_json(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, or the right 4xx."""
    check_json_type(request)
    return parse_json(await read_body(request, max_bytes))


def is_json_type(media_type: str) -> bool:
    """Whether a media type (lowercase, without parameters) declares JSON."""
    return media_type == "application/json" or media_type.endswith("+json")


def check_json_type(request: web.Request) -> None:
    """415 unless the body is declared JSON."""
    ctype = request.content_type
    if not is_json_type(ctype):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {ctype or 'none'})"
        )


def parse_json(body: bytes) -> dict[str, Any]:
    """A body as a JSON object: 400 when it is not JSON, 422 when it is not an object."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValidationFailed("body", "must be a JSON object")
    return data


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole body (to the end of its Content-Length or last chunk), 413 past ``max_bytes``.

    Reads until the payload ends, however the bytes are split on the wire; a body shorter than
    its Content-Length waits for the rest. Stops reading as soon as the total passes the limit,
    chunked bodies included.
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise PayloadTooLarge(f"request body is {length} bytes; limit {max_bytes}")
    content = request.content
    try:
        chunk = await content.readany()  # everything buffered so far
        if content.is_eof():  # the whole body came at once (the common case): no copies
            if len(chunk) > max_bytes:
                raise PayloadTooLarge(f"request body over the limit of {max_bytes} bytes")
            return bytes(chunk)
        body = bytearray()
        while chunk:
            body += chunk
            if len(body) > max_bytes:
                raise PayloadTooLarge(f"request body over the limit of {max_bytes} bytes")
            chunk = await content.readany()
    except web.RequestPayloadError:  # broken chunk framing, or a decoding error
        raise BadRequest("request body is malformed (transfer or content encoding)") from None
    except ConnectionResetError:  # the client left mid-body; the answer reaches no one
        raise BadRequest("the connection closed before the request body was complete") from None
    return bytes(body)
