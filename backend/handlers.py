"""HTTP handlers: each parses its request, calls the data plane, renders the answer.

Typed app state lives under the ``web.AppKey``s below; ``create_app`` fills it.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import hdrs, web

from backend import oip, oip_response, openai
from backend.dataplane import DataPlane, EmbedResult
from backend.envelope import check_content_type, server_timing, timeout_from_header
from backend.errors import BadRequest, ClientDisconnected, PayloadTooLarge
from backend.metrics import BackendMetrics

DATAPLANE = web.AppKey("dataplane", DataPlane)
METRICS = web.AppKey("metrics", BackendMetrics)
# "on: GPU 0" or "off: <why>": said once in the startup log, and in /v2/health/ready.
GPU_METRICS = web.AppKey("gpu_metrics", str)
# Set on inference requests so the middleware can count them by model.
MODEL_LABEL = web.RequestKey("model", str)
REQUEST_ID = web.RequestKey("request_id", str)
TIMEOUT_HEADER = "X-Request-Timeout-Ms"
BINARY_HEADER = "Inference-Header-Content-Length"


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    """A JSON response from an object or from already-encoded bytes."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return web.Response(body=raw, status=status, headers=headers, content_type="application/json")


async def server_metadata(request: web.Request) -> web.Response:
    return json_response(request.app[DATAPLANE].server_metadata())


async def live(request: web.Request) -> web.Response:
    return json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    # The spec's server-ready object shows a "live" field (copied from the live one); OIP
    # servers answer "ready". Both are here, and the status code says it for probes.
    is_ready = request.app[DATAPLANE].ready
    gpu = request.app.get(GPU_METRICS, "off: gpu_metrics_interval_s is 0")
    return json_response({"live": True, "ready": is_ready, "gpu_metrics": gpu},
                         status=200 if is_ready else 503)


async def model_metadata(request: web.Request) -> web.Response:
    served = request.app[DATAPLANE].get(request.match_info["model"],
                                        request.match_info.get("version"))
    return json_response(oip_response.model_metadata(served.config, served.model.identity))


async def model_ready(request: web.Request) -> web.Response:
    served = request.app[DATAPLANE].get(request.match_info["model"],
                                        request.match_info.get("version"))
    return json_response({"name": served.config.name, "ready": served.ready},
                         status=200 if served.ready else 503)


async def infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{model}[/versions/{version}]/infer``."""
    started = time.monotonic()
    plane = request.app[DATAPLANE]
    request[MODEL_LABEL] = "unknown"
    served = plane.get(request.match_info["model"], request.match_info.get("version"))
    request[MODEL_LABEL] = served.config.name
    header_s = timeout_from_header(request.headers.get(TIMEOUT_HEADER))
    check_content_type(request.headers.get(hdrs.CONTENT_TYPE))
    body = await read_body(request)
    parsed = oip.parse_infer_request(
        body,
        input_spec=served.config.input,
        output_names=[t.name for t in served.config.outputs],
        max_items=served.max_items,
        json_length=_json_length(request.headers.get(BINARY_HEADER)),
    )
    schedule = parsed.schedule
    timeout_s = schedule.timeout_s(header_s)
    result = await plane.embed(
        served, parsed.texts, deadline=None if timeout_s is None else started + timeout_s,
        priority=schedule.priority, key=schedule.fairness_key, express=schedule.express)
    encoded = oip_response.encode_infer_response(
        config=served.config,
        request=parsed,
        embeddings=result.embeddings,
        token_counts=result.token_counts,
        parameters={
            "queue_time_ms": round(result.queue_s * 1000, 3),
            "compute_time_ms": round(result.compute_s * 1000, 3),
            "batch_size": result.batch_size,
        },
    )
    headers = _timing_headers(result)
    if encoded.json_length is None:
        return json_response(encoded.body, headers=headers)
    headers[BINARY_HEADER] = str(encoded.json_length)  # JSON first, then the binary outputs
    return web.Response(body=encoded.body, headers=headers,
                        content_type="application/octet-stream")


async def embeddings(request: web.Request) -> web.Response:
    """OpenAI-compatible ``POST /v1/embeddings``."""
    started = time.monotonic()
    plane = request.app[DATAPLANE]
    request[MODEL_LABEL] = "unknown"
    timeout_s = timeout_from_header(request.headers.get(TIMEOUT_HEADER))
    check_content_type(request.headers.get(hdrs.CONTENT_TYPE))
    parsed = openai.parse_embeddings_request(
        await read_body(request), max_items=plane.settings.max_items_per_request
    )
    served = plane.get(parsed.model)
    request[MODEL_LABEL] = served.config.name
    if parsed.dimensions is not None and parsed.dimensions != served.config.dim:
        raise BadRequest(f"'dimensions': model {served.config.name!r} returns "
                         f"{served.config.dim}-dimensional embeddings only")
    result = await plane.embed(
        served, parsed.texts, deadline=None if timeout_s is None else started + timeout_s)
    encoded = openai.encode_embeddings_response(
        model=served.config.name,
        embeddings=result.embeddings,
        token_counts=result.token_counts,
        encoding_format=parsed.encoding_format,
    )
    return json_response(encoded, headers=_timing_headers(result))


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})


async def cold_starts(request: web.Request) -> web.Response:
    """``GET /coldstart``: load, warm-up, first-answer and early-answer figures per model."""
    return json_response(request.app[DATAPLANE].cold_starts())


async def read_body(request: web.Request) -> bytes:
    """The whole body (``request.read`` waits for its last byte, however it is split), or
    413 past the app's ``client_max_size``; 400 when its content encoding is corrupt;
    ``ClientDisconnected`` when the client leaves before sending it all."""
    # create_app gives aiohttp the same limit, so its own check (chunked bodies) agrees.
    limit = request.app[DATAPLANE].settings.client_max_size
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit}"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from None
    except ConnectionResetError:  # aiohttp's word for "the connection was lost mid-body"
        raise ClientDisconnected("client disconnected before sending the whole body") from None
    except web.RequestPayloadError as exc:  # e.g. a gzip body that does not decompress
        why = getattr(exc.__cause__, "message", None) or "malformed payload"
        raise BadRequest(f"request body cannot be read: {why}") from None


def _json_length(value: str | None) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):  # int() would also take " 5", "+5", "٣"
        raise BadRequest(f"{BINARY_HEADER} must be an integer")
    return int(value)


def _timing_headers(result: EmbedResult) -> dict[str, str]:
    return {"Server-Timing": server_timing(result.queue_s, result.compute_s)}
