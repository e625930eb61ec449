"""The ``grpc.aio`` server: bound, started and stopped with the app, in the app's event loop.

Calls are registered under Triton's service name, ``inference.GRPCInferenceService``, which is
all that a client (tritonclient, KServe's) puts on the wire besides the messages.

The port is bound without ``SO_REUSEPORT`` (grpcio sets it by default on Linux): with it, a
second backend on the same port would silently share the first one's traffic. A port that is
taken is then a clear failure: ``GrpcPortUnavailable`` (exit 2) when the port was asked for,
a warning and REST only when it is the default (see ``ServeSettings.grpc_port``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from backend.dataplane import DataPlane
from backend.metrics import BackendMetrics
from backend.rpc.service import InferenceService
from backend.settings import ServeSettings
from oip import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
# Running calls get this long to finish at shutdown (REST's runner waits for its own).
STOP_GRACE_S = 10.0

log = logging.getLogger("backend.rpc")


class GrpcPortUnavailable(Exception):
    """The gRPC port that was asked for cannot be bound; the message names it."""


@contextlib.asynccontextmanager
async def grpc_server(plane: DataPlane, metrics: BackendMetrics, settings: ServeSettings
                      ) -> AsyncIterator[grpc.aio.Server | None]:
    """Serves ``inference.GRPCInferenceService`` on ``settings.grpc_listen_port`` while open;
    yields None when the default port is taken (and then serves nothing)."""
    service = InferenceService(plane, metrics, log_requests=settings.access_log)
    handlers = _handlers(service, metrics)
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 0),
        # The REST body limit, for the same reason (413 there; RESOURCE_EXHAUSTED here).
        ("grpc.max_receive_message_length", settings.client_max_size),
    ])
    server.add_registered_method_handlers(SERVICE, handlers)
    host, port = settings.host, settings.grpc_listen_port
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # Probing first keeps grpcio's own (non-JSON) error line out of the log in the usual case.
    bound = _bindable(host, port)
    if bound:
        try:
            bound = server.add_insecure_port(address) != 0
        except RuntimeError:  # grpcio's word for "could not bind"
            bound = False
    if not bound:
        if settings.grpc_port is not None:
            raise GrpcPortUnavailable(
                f"cannot listen for gRPC on {address}: the port is taken "
                "(--grpc-port chooses another, 0 turns gRPC off)")
        log.warning("default gRPC port taken; serving REST only", extra={"fields": {
            "address": address, "hint": "--grpc-port chooses another port, 0 turns gRPC off"}})
        yield None
        return
    await server.start()
    log.info("serving gRPC", extra={"fields": {"address": address, "service": SERVICE}})
    try:
        yield server
    finally:
        await server.stop(STOP_GRACE_S)


def _bindable(host: str, port: int) -> bool:
    """Whether ``host:port`` can be listened on now (bound with SO_REUSEADDR, as grpcio
    does, then released)."""
    try:
        with socket.create_server((host, port)):
            return True
    except OSError:
        return False


class _Malformed:
    """What the deserializer hands the method for bytes that are not the request message."""


MALFORMED = _Malformed()
MALFORMED_MESSAGE = "malformed request: the message is not valid protobuf"


def _handlers(service: InferenceService, metrics: BackendMetrics
              ) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    def unary(name: str, method: Callable[..., Any], request: Any, response: Any
              ) -> grpc.RpcMethodHandler[Any, Any]:
        # grpcio answers a deserializer that raises with UNKNOWN, a message naming the internal
        # type and a logged traceback per call; a malformed message is the client's error.
        def parse(data: bytes) -> Any:
            try:
                return request.FromString(data)
            except DecodeError:
                return MALFORMED

        async def call(message: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if message is MALFORMED:
                metrics.grpc_malformed.labels(name).inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_MESSAGE)
            return await method(message, context)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=parse, response_serializer=response.SerializeToString)

    return {
        "ServerLive": unary("ServerLive", service.server_live, pb.ServerLiveRequest,
                            pb.ServerLiveResponse),
        "ServerReady": unary("ServerReady", service.server_ready, pb.ServerReadyRequest,
                             pb.ServerReadyResponse),
        "ServerMetadata": unary("ServerMetadata", service.server_metadata,
                                pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelReady": unary("ModelReady", service.model_ready, pb.ModelReadyRequest,
                            pb.ModelReadyResponse),
        "ModelMetadata": unary("ModelMetadata", service.model_metadata,
                               pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelInfer": unary("ModelInfer", service.model_infer, pb.ModelInferRequest,
                            pb.ModelInferResponse),
    }
