"""A gRPC request whose bytes are not the request message: INVALID_ARGUMENT, a plain message
(no internal type name), no traceback in the log, one count in the metric (issue 20, item 6)."""

from __future__ import annotations

import logging

import grpc
import grpc.aio
import pytest
from google.protobuf.message import DecodeError

from backend.dataplane import DataPlane
from backend.metrics import BackendMetrics
from backend.model import EmbeddingModel
from backend.rpc.server import grpc_server
from backend.settings import ServeSettings
from bench.procs import free_port
from oip import inference_pb2 as ours
from tests.backend.serving import metric

pytestmark = pytest.mark.model

# Field 1 (model_name) as a length-delimited string that claims 100 bytes but carries 2.
TRUNCATED = b"\x0a\x64ab"


async def test_a_malformed_message_is_invalid_argument_without_a_traceback(
    models: list[EmbeddingModel], caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(DecodeError):  # the bytes really are not a ModelInferRequest
        ours.ModelInferRequest.FromString(TRUNCATED)
    port = free_port()
    settings = ServeSettings(device="cpu", grpc_port=port)
    metrics = BackendMetrics()
    plane = DataPlane(models, settings, metrics)
    caplog.set_level(logging.DEBUG)
    async with grpc_server(plane, metrics, settings), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                  request_serializer=None, response_deserializer=None)
        errors = []
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await raw(TRUNCATED, timeout=10)
            errors.append(info.value)
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=ours.ServerLiveRequest.SerializeToString,
            response_deserializer=ours.ServerLiveResponse.FromString)
        assert (await live(ours.ServerLiveRequest(), timeout=10)).live is True
    for error in errors:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = error.details() or ""
        assert "not valid protobuf" in details
        assert "inference." not in details and "Request" not in details
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert metric(metrics.render()[0].decode(), "backend_grpc_malformed_total",
                  method="ModelInfer") == 3
