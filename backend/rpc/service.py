"""The ``inference.GRPCInferenceService`` calls over the data plane: the gRPC twin of
``handlers.py`` plus what the REST middleware does for inference (request id, metrics, the
access log).

- Errors: every ``BackendError`` aborts the call with its ``grpc_code`` (``errors.py``) and
  the message REST would show; ``Retry-After`` travels as ``retry-after`` trailing metadata.
- Scheduling: the call's gRPC deadline is the request's deadline, shortened by a ``timeout``
  parameter (none: the priority level's default timeout); ``priority`` and ``fairness_key``
  parameters as over REST (``backend/scheduling/params.py``). A call that grpcio cancels
  when its deadline passes is dropped from the batcher like a REST request whose client left.
- Metrics: ``backend_requests_total{protocol="grpc"}`` with the status REST would answer, so
  one error-rate query covers both protocols.
- Timing: ``server-timing`` trailing metadata, the value of REST's ``Server-Timing`` header;
  ``x-request-id`` echoed (or assigned) there too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, NoReturn

import grpc
import grpc.aio

from backend.dataplane import DataPlane, ServedModel
from backend.envelope import MAX_TIMEOUT_MS, request_id, server_timing
from backend.errors import BackendError
from backend.logs import access_log, write_access_line
from backend.metrics import BackendMetrics
from backend.rpc import tensors
from oip import inference_pb2 as pb

Context = grpc.aio.ServicerContext[Any, Any]
REQUEST_ID_KEY = "x-request-id"

log = logging.getLogger("backend.rpc")


class InferenceService:
    """The calls of ``inference.GRPCInferenceService`` that this backend serves."""

    def __init__(self, plane: DataPlane, metrics: BackendMetrics, *, log_requests: bool = True
                 ) -> None:
        self._plane = plane
        self._requests = metrics.requests
        self._counted: dict[tuple[str, int], Any] = {}  # labels() once per model and status
        self._log_requests = log_requests

    async def server_live(self, request: pb.ServerLiveRequest, context: Context
                          ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: Context
                           ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._plane.ready)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Context
                              ) -> pb.ServerMetadataResponse:
        meta = self._plane.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                         extensions=meta["extensions"])

    async def model_ready(self, request: pb.ModelReadyRequest, context: Context
                          ) -> pb.ModelReadyResponse:
        served = await self._lookup(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=served.ready)

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Context
                             ) -> pb.ModelMetadataResponse:
        served = await self._lookup(request.name, request.version, context)
        return tensors.model_metadata(served.config)

    async def model_infer(self, request: pb.ModelInferRequest, context: Context
                          ) -> pb.ModelInferResponse:
        """Validates, embeds through the model's batcher, answers with raw outputs."""
        started = time.monotonic()
        rid = _request_id(context)
        model, status, code = "unknown", 500, "INTERNAL"
        try:
            plane = self._plane
            served = plane.get(request.model_name, request.model_version or None)
            model = served.config.name
            config = served.config
            parsed = tensors.parse_infer_request(
                request, input_spec=config.input,
                output_names=[t.name for t in config.outputs], max_items=served.max_items,
            )
            remaining = context.time_remaining()
            schedule = parsed.schedule
            timeout_s = schedule.timeout_s(
                None if remaining is None else min(remaining, MAX_TIMEOUT_MS / 1000.0))
            result = await plane.embed(
                served, parsed.texts,
                deadline=None if timeout_s is None else started + timeout_s,
                priority=schedule.priority, key=schedule.fairness_key,
                express=schedule.express)
            response = tensors.encode_infer_response(
                config=config, request=parsed, embeddings=result.embeddings,
                token_counts=result.token_counts,
                parameters={"queue_time_ms": round(result.queue_s * 1000, 3),
                            "compute_time_ms": round(result.compute_s * 1000, 3),
                            "batch_size": result.batch_size},
            )
            context.set_trailing_metadata((
                ("server-timing", server_timing(result.queue_s, result.compute_s)),
                (REQUEST_ID_KEY, rid),
            ))
            status, code = 200, "OK"
            return response
        except BackendError as exc:
            status, code = exc.status, exc.grpc_code
            await _abort(context, exc, rid)
        except asyncio.CancelledError:
            # grpcio cancels the call when its deadline passes or its client goes away.
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            status, code = (504, "DEADLINE_EXCEEDED") if expired else (499, "CANCELLED")
            raise
        except Exception as exc:
            log.error("unhandled error", exc_info=exc, extra={"fields": {
                "request_id": rid, "method": "ModelInfer"}})
            await _abort(context, BackendError("internal error"), rid)
        finally:
            counter = self._counted.get((model, status))
            if counter is None:
                counter = self._requests.labels(model, str(status), "grpc")
                self._counted[(model, status)] = counter
            counter.inc()
            if self._log_requests and access_log.isEnabledFor(logging.INFO):
                # Kept and written with others (logs.py), after the answer has gone.
                write_access_line(logging.INFO, {
                    "request_id": rid, "protocol": "grpc", "method": "ModelInfer",
                    "model": model, "status": status, "grpc_status": code,
                    "duration_ms": round((time.monotonic() - started) * 1000, 3)})

    async def _lookup(self, name: str, version: str, context: Context) -> ServedModel:
        try:
            return self._plane.get(name, version or None)
        except BackendError as exc:
            await _abort(context, exc, _request_id(context))


async def _abort(context: Context, exc: BackendError, rid: str) -> NoReturn:
    """Ends the call with the error's status code, message and trailing metadata."""
    # REST's extra headers (Retry-After) as metadata; gRPC keys are lower case.
    metadata = ((REQUEST_ID_KEY, rid), *((k.lower(), v) for k, v in exc.headers().items()))
    await context.abort(grpc.StatusCode[exc.grpc_code], exc.message, metadata)


def _request_id(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and isinstance(value, str):
            return request_id(value)
    return request_id(None)
