"""Body parsing and schema checks shared by the handlers.

Order matters and is the contract: content type (415), size (413), JSON (400), schema (422).
Nothing here talks to a backend or a cache.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from gateway.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType, ValidationFailed


async def read_json(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, or the right 4xx."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {ctype or 'none'})"
        )
    body = await read_body(request, max_bytes)
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
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"request body is {request.content_length} bytes; limit {max_bytes}")
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > max_bytes:
                raise PayloadTooLarge(f"request body over the limit of {max_bytes} bytes")
    except web.RequestPayloadError:  # broken chunk framing, or a decoding error
        raise BadRequest("request body is malformed (transfer or content encoding)") from None
    except ConnectionResetError:  # the client left mid-body; the answer reaches no one
        raise BadRequest("the connection closed before the request body was complete") from None
    return bytes(body)


def require_str(data: dict[str, Any], field: str, *, allow_empty: bool = False) -> str:
    value = data.get(field)
    if value is None:
        raise ValidationFailed(field, "is required")
    if not isinstance(value, str):
        raise ValidationFailed(field, f"must be a string, not {type(value).__name__}")
    if not allow_empty and not value:
        raise ValidationFailed(field, "must not be empty")
    return value


def text_list(value: Any, field: str, *, allow_single: bool = True) -> list[str]:
    """A string or a non-empty list of strings (each checked, with its index in the message)."""
    if isinstance(value, str) and allow_single:
        return [value]
    if value is None:
        raise ValidationFailed(field, "is required")
    if not isinstance(value, list):
        kinds = "a string or a list of strings" if allow_single else "a list of strings"
        raise ValidationFailed(field, f"must be {kinds}")
    if not value:
        raise ValidationFailed(field, "must not be empty")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            if isinstance(item, int) or (isinstance(item, list) and item
                                         and isinstance(item[0], int)):
                raise ValidationFailed(f"{field}[{i}]",
                                       "token arrays are not supported; send text")
            raise ValidationFailed(f"{field}[{i}]", f"must be a string, not {type(item).__name__}")
    return value


def check_keys(data: dict[str, Any], allowed: set[str]) -> None:
    """Unknown fields are a 422, so a typo never silently changes behaviour."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValidationFailed(unknown[0], f"unknown field (allowed: {', '.join(sorted(allowed))})")
