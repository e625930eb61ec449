"""The Files and Batches routes (OpenAI's shapes): HTTP in and out, nothing else.

Order on every route: tenant (401), then the service (503 without Redis), then the request
(415/413/400/422), then the stores (404 for an unknown or another tenant's id). Redis errors
become a 503 with ``Retry-After``; the address of Redis is never shown.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from redis.exceptions import RedisError

from gateway.adapters.fields import check_keys, require_str
from gateway.adapters.registry import BATCH_PATHS
from gateway.batch.errors import BatchUnavailable
from gateway.errors import (
    GatewayError,
    MalformedRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)
from gateway.http import app_state as state
from gateway.http.body import read_json
from gateway.http.serve import identify

if TYPE_CHECKING:  # service.py imports this module
    from gateway.http.batch_jobs import BatchService

Handler = Callable[[web.Request], Awaitable[web.Response]]
ServiceOf = Callable[[web.Request], "BatchService"]

_WINDOW = re.compile(r"^([1-9][0-9]{0,2})h$")
_MAX_WINDOW_H = 168
_FIELD_BYTES = 4096  # a form field other than the file (purpose...)
_CHUNK = 65536


def _json(data: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def _guard(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def run(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except GatewayError:  # e.g. BodyTimeout, which is a TimeoutError (an OSError) too
            raise
        except (RedisError, OSError):
            raise BatchUnavailable("the batch store is unreachable; try again shortly",
                                   retry_after_s=2.0) from None

    return run


def add(app: web.Application, service_of: ServiceOf) -> None:
    """Register the routes; ``service_of`` finds the service (503 when there is none)."""

    def tenant_and(request: web.Request) -> tuple[str, BatchService]:
        tenant = identify(request)
        return tenant, service_of(request)

    @_guard
    async def upload(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        limit = request.app[state.SETTINGS].batch.max_file_bytes
        purpose, filename, data = await _read_form(request, limit)
        if purpose != "batch":
            raise ValidationFailed("purpose", f"must be 'batch' (got {purpose!r})")
        if data is None:
            raise ValidationFailed("file", "is required (a JSONL file, one request per line)")
        meta = await service.files.upload(tenant, filename, data)
        return _json(meta.view())

    @_guard
    async def file_get(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        meta = await service.files.get(tenant, request.match_info["file_id"])
        return _json(meta.view())

    @_guard
    async def file_content(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        data = await service.files.content(tenant, request.match_info["file_id"])
        return web.Response(body=data, content_type="application/octet-stream")

    @_guard
    async def file_delete(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        file_id = request.match_info["file_id"]
        await service.files.delete(tenant, file_id, active=service.jobs.active)
        return _json({"id": file_id, "object": "file", "deleted": True})

    @_guard
    async def batch_create(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        body = await read_json(request, request.app[state.SETTINGS].max_body_bytes)
        check_keys(body, {"input_file_id", "endpoint", "completion_window", "metadata",
                          "output_expires_after"})
        file_id = require_str(body, "input_file_id")
        endpoint = require_str(body, "endpoint")
        if endpoint not in BATCH_PATHS:
            raise ValidationFailed("endpoint", f"must be one of {', '.join(BATCH_PATHS)} "
                                               f"(got {endpoint!r})")
        window = require_str(body, "completion_window")
        m = _WINDOW.match(window)
        if m is None or int(m.group(1)) > _MAX_WINDOW_H:
            raise ValidationFailed("completion_window",
                                   f"must be hours such as '24h', at most {_MAX_WINDOW_H}h")
        metadata = _metadata(body.get("metadata"))
        source = await service.files.get(tenant, file_id)
        if source.purpose != "batch":
            raise ValidationFailed("input_file_id", "must be a file uploaded with purpose "
                                                    "'batch'")
        job = await service.jobs.create(tenant, source, endpoint=endpoint, window=window,
                                        window_s=int(m.group(1)) * 3600.0, metadata=metadata)
        return _json(job.view())

    @_guard
    async def batch_get(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        job = await service.jobs.get(tenant, request.match_info["batch_id"])
        return _json(job.view())

    @_guard
    async def batch_cancel(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        job = await service.jobs.cancel(tenant, request.match_info["batch_id"])
        return _json(job.view())

    @_guard
    async def batch_list(request: web.Request) -> web.Response:
        tenant, service = tenant_and(request)
        after = request.query.get("after") or None
        raw = request.query.get("limit", "20")
        # isascii(): str.isdigit() also takes "²" (which int() refuses) and "٣" (which it reads).
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 100:
            raise ValidationFailed("limit", "must be an integer from 1 to 100")
        jobs, more = await service.jobs.page(tenant, after=after, limit=int(raw))
        data = [j.view() for j in jobs]
        return _json({"object": "list", "data": data, "has_more": more,
                      "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None})

    r = app.router
    r.add_post("/v1/files", upload)
    r.add_get("/v1/files/{file_id}", file_get)
    r.add_delete("/v1/files/{file_id}", file_delete)
    r.add_get("/v1/files/{file_id}/content", file_content)
    r.add_post("/v1/batches", batch_create)
    r.add_get("/v1/batches", batch_list)
    r.add_get("/v1/batches/{batch_id}", batch_get)
    r.add_post("/v1/batches/{batch_id}/cancel", batch_cancel)


def _metadata(value: object) -> dict[str, str] | None:
    """OpenAI's metadata: up to 16 string pairs, keys up to 64 and values up to 512 chars."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 16:
        raise ValidationFailed("metadata", "must be an object of at most 16 string pairs")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > 512:
            raise ValidationFailed(f"metadata.{key[:64]}", "keys must be at most 64 characters "
                                                           "and values strings of at most 512")
    return value


async def _read_form(request: web.Request, limit: int) -> tuple[str | None, str, bytes | None]:
    """(purpose, filename, file bytes) of a multipart upload; 413 as soon as the file passes
    ``limit``, without reading the rest."""
    if not request.content_type.startswith("multipart/form-data"):
        raise UnsupportedMediaType("Content-Type must be multipart/form-data with the fields "
                                   "purpose and file")
    if request.content_length is not None and request.content_length > limit + _CHUNK:
        raise PayloadTooLarge(f"upload is {request.content_length} bytes; the file limit is "
                              f"{limit} (batch.max_file_bytes)")
    purpose: str | None = None
    filename = "input.jsonl"
    data: bytes | None = None
    extra = 0
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise MalformedRequest("nested multipart bodies are not accepted")
            if part.name not in ("file", "purpose"):
                # Another form field: ignored, as OpenAI's API does, but its bytes count toward
                # the file limit so that no number of parts reads an unbounded body.
                while chunk := await part.read_chunk(_CHUNK):
                    extra += len(chunk)
                    if extra > limit:
                        raise PayloadTooLarge(f"upload is over the limit of {limit} bytes "
                                              "(batch.max_file_bytes)")
                continue
            bound = limit if part.name == "file" else _FIELD_BYTES
            value = bytearray()
            while chunk := await part.read_chunk(_CHUNK):
                value += chunk
                if len(value) > bound:
                    raise PayloadTooLarge(
                        f"file is over the limit of {limit} bytes (batch.max_file_bytes)"
                        if part.name == "file" else f"form field {part.name!r} is too long")
            if part.name == "file":
                filename = (part.filename or filename)[:255]
                data = bytes(value)
            elif part.name == "purpose":
                purpose = value.decode("utf-8", "replace").strip()
    except (ValueError, AssertionError, HttpProcessingError, web.RequestPayloadError,
            ConnectionResetError):
        raise MalformedRequest("the multipart body is malformed") from None
    return purpose, filename, data
