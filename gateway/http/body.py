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
    check_json_type(request)
    return parse_json(await read_body(request, max_bytes))


def check_json_type(request: web.Request) -> None:
    """415 unless the body is declared JSON."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
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
