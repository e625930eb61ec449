"""The OIP gRPC service against a real ``python -m backend serve`` process, with tritonclient.

``tritonclient.grpc.InferenceServerClient`` is used unchanged: if the service, its message
layout or its status codes differed from Triton's, these would fail. The REST answers of the
same process are the reference for the embeddings.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import service_pb2 as triton
from tritonclient.utils import InferenceServerException

from backend.dataplane import DataPlane
from backend.metrics import BackendMetrics
from backend.model import EmbeddingModel
from backend.rpc.server import grpc_server
from backend.settings import ServeSettings
from bench.procs import Service, free_port
from oip import inference_pb2 as ours
from tests.backend.serving import metric

pytestmark = pytest.mark.model

LONG = "the quick brown fox jumps over the lazy dog " * 40  # past 256 tokens
MAX_BATCH, MAX_QUEUE = 8, 64


@dataclass
class Backend:
    rest: str
    grpc: str

    def metric(self, name: str, **labels: str) -> float:
        return metric(httpx.get(f"{self.rest}/metrics", timeout=10).text, name, **labels)


@pytest.fixture(scope="module")
def backend(models_dir: Path) -> Iterator[Backend]:
    """A backend process with small batches and a small queue, so that one large request
    keeps its worker busy long enough to build a backlog."""
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
            "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
            "--device", "cpu", "--max-batch-size", str(MAX_BATCH),
            "--max-queue-size", str(MAX_QUEUE), "--log-level", "WARNING"]
    with Service("backend-grpc", argv) as server:
        server.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=180)
        yield Backend(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")


@pytest.fixture
def client(backend: Backend) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(backend.grpc) as made:
        yield made


def texts_input(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def rest_embeddings(backend: Backend, texts: list[str]) -> np.ndarray[Any, Any]:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}]}
    response = httpx.post(f"{backend.rest}/v2/models/minilm/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    (out,) = [o for o in response.json()["outputs"] if o["name"] == "embedding"]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_live_ready_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("minilm") and client.is_model_ready("minilm", "1")
    assert client.get_server_metadata().name == "edge-backend"
    meta = client.get_model_metadata("minilm", as_json=True)
    assert meta["name"] == "minilm" and meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == \
        [("text", "BYTES", ["-1"])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == \
        [("embedding", "FP32", ["-1", "384"]), ("token_count", "INT32", ["-1"])]


def test_infer_equals_the_rest_answer(backend: Backend,
                                      client: grpcclient.InferenceServerClient) -> None:
    texts = ["How do I reset my password?", "héllo wörld ✓", "", LONG]
    result = client.infer("minilm", [texts_input(texts)], request_id="abc-1")
    got = result.as_numpy("embedding")
    assert got.shape == (4, 384) and got.dtype == np.float32
    want = rest_embeddings(backend, texts)
    assert np.min((got * want).sum(1)) > 0.9999
    assert result.as_numpy("token_count").tolist()[-1] == 256  # truncated like REST
    response = result.get_response()
    assert response.id == "abc-1"
    assert {"queue_time_ms", "compute_time_ms", "batch_size"} <= set(response.parameters)


def test_timing_and_request_id_come_back_in_trailing_metadata(backend: Backend) -> None:
    import grpc

    request = ours.ModelInferRequest(model_name="minilm")
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(len(b"hi").to_bytes(4, "little") + b"hi")
    with grpc.insecure_channel(backend.grpc) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=ours.ModelInferRequest.SerializeToString,
            response_deserializer=ours.ModelInferResponse.FromString,
        )
        response, info = call.with_call(request, metadata=(("x-request-id", "trace-7"),),
                                        timeout=30)
    trailing = dict(info.trailing_metadata())
    assert trailing["x-request-id"] == "trace-7"
    assert trailing["server-timing"].startswith("queue;dur=")
    assert ", compute;dur=" in trailing["server-timing"]
    assert [o.name for o in response.outputs] == ["embedding", "token_count"]
    assert len(response.raw_output_contents[0]) == 384 * 4


def test_only_the_outputs_asked_for(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("minilm", [texts_input(["a"])],
                          outputs=[grpcclient.InferRequestedOutput("token_count")])
    assert result.as_numpy("embedding") is None
    assert result.as_numpy("token_count").tolist() == [3]


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        (lambda c: c.infer("nope", [texts_input(["a"])]), "NOT_FOUND", "unknown model 'nope'"),
        (lambda c: c.infer("minilm", [texts_input(["a"])], model_version="7"), "NOT_FOUND",
         "no version '7'"),
        (lambda c: c.get_model_metadata("nope"), "NOT_FOUND", "unknown model"),
        (lambda c: c.is_model_ready("nope"), "NOT_FOUND", "unknown model"),
        (lambda c: c.infer("minilm", [_fp32_input()]), "INVALID_ARGUMENT",
         "datatype 'FP32'; expected BYTES"),
        (lambda c: c.infer("minilm", [texts_input(["a"] * (MAX_QUEUE + 1))]),
         "INVALID_ARGUMENT", "too many items"),
        (lambda c: c.infer("minilm", [texts_input(["a"])],
                           outputs=[grpcclient.InferRequestedOutput("logits")]),
         "INVALID_ARGUMENT", "unknown output 'logits'"),
    ],
    ids=["unknown-model", "unknown-version", "metadata", "ready", "datatype", "too-many",
         "output"],
)
def test_errors_are_status_codes_with_messages(
    client: grpcclient.InferenceServerClient, call: Any, code: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client)
    assert info.value.status() == f"StatusCode.{code}"
    assert message in info.value.message()


def _fp32_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return tensor


def test_a_deadline_the_work_ahead_outlasts_is_unavailable_at_once_and_never_computed(
    backend: Backend, client: grpcclient.InferenceServerClient
) -> None:
    rows_before = backend.metric("backend_batch_size_sum")
    shed_before = backend.metric("backend_requests_total", protocol="grpc", status="503")
    with busy_worker(backend):
        # Queued behind the large request's 7 other batches (8 x 256 tokens each: 300 ms
        # with two threads on an idle 2-core machine, longer on a busy one): the scheduler's
        # learned cost says it cannot finish within its 1 s, so it is told now (a deadline
        # that passes while queued is DEADLINE_EXCEEDED: tests/backend/test_batching.py).
        with pytest.raises(InferenceServerException) as info:
            client.infer("minilm", [texts_input(["late"])], client_timeout=1.0)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert "deadline" in info.value.message()
    assert backend.metric("backend_requests_total", protocol="grpc", status="503") == \
        shed_before + 1
    assert backend.metric("backend_batch_size_sum") == rows_before + MAX_QUEUE  # not "late"


def test_a_full_queue_is_unavailable_with_retry_after(backend: Backend) -> None:
    import grpc

    # The large request's texts fill the queue but for one batch (computing): these overflow.
    request = ours.ModelInferRequest(model_name="minilm")
    request.inputs.add(name="text", datatype="BYTES", shape=[MAX_BATCH + 1])
    request.inputs[0].contents.bytes_contents.extend([b"x"] * (MAX_BATCH + 1))
    with busy_worker(backend), grpc.insecure_channel(backend.grpc) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=ours.ModelInferRequest.SerializeToString,
            response_deserializer=ours.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=30)
    error: Any = info.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "queue full" in error.details()
    assert int(dict(error.trailing_metadata())["retry-after"]) >= 1
    assert backend.metric("backend_requests_total", protocol="grpc", status="503") >= 1


class busy_worker:  # a context manager, named for how it reads
    """Keeps the backend's worker busy: a REST request of ``MAX_QUEUE`` long texts, whose
    first batch computes while the rest wait; entered once that backlog is queued, left once
    the request has been answered."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.status: int | None = None
        self.thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [MAX_QUEUE],
                            "data": [LONG] * MAX_QUEUE}]}
        self.status = httpx.post(f"{self.backend.rest}/v2/models/minilm/infer", json=body,
                                 timeout=120).status_code

    def __enter__(self) -> busy_worker:
        self.thread.start()
        for _ in range(2000):  # bounded: ~20 s
            if self.backend.metric("backend_queue_depth", model="minilm") > 0:
                return self
            if not self.thread.is_alive():
                break
            threading.Event().wait(0.01)
        raise AssertionError("the large request never built a backlog")

    def __exit__(self, *exc: object) -> None:
        self.thread.join(120)
        assert self.status == 200


def test_message_layout_is_tritons() -> None:
    """Every message served has Triton's field numbers, names, types and nesting."""
    for name in ("ServerLiveRequest", "ServerLiveResponse", "ServerReadyRequest",
                 "ServerReadyResponse", "ModelReadyRequest", "ModelReadyResponse",
                 "ServerMetadataRequest", "ServerMetadataResponse", "ModelMetadataRequest",
                 "ModelMetadataResponse", "InferParameter", "InferTensorContents",
                 "ModelInferRequest", "ModelInferResponse"):
        assert layout(ours.DESCRIPTOR.message_types_by_name[name]) == \
            layout(triton.DESCRIPTOR.message_types_by_name[name]), name


def layout(message: Descriptor) -> list[Any]:
    fields = [(f.number, f.name, f.type, f.is_repeated,
               layout(f.message_type) if f.message_type else None,
               f.containing_oneof.name if f.containing_oneof else None)
              for f in message.fields]
    return sorted(fields, key=lambda f: f[0])


async def test_a_model_not_ready_is_unavailable_with_retry_after(
    models: list[EmbeddingModel],
) -> None:
    """The service in-process over a data plane that has not warmed up (never started)."""
    import grpc.aio

    port = free_port()
    settings = ServeSettings(device="cpu", grpc_port=port)
    metrics = BackendMetrics()
    plane = DataPlane(models, settings, metrics)
    request = ours.ModelInferRequest(model_name="minilm")
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.inputs[0].contents.bytes_contents.append(b"too early")
    async with grpc_server(plane, metrics, settings), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=ours.ServerReadyRequest.SerializeToString,
            response_deserializer=ours.ServerReadyResponse.FromString,
        )
        assert (await ready(ours.ServerReadyRequest(), timeout=10)).ready is False
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=ours.ModelInferRequest.SerializeToString,
            response_deserializer=ours.ModelInferResponse.FromString,
        )
        call = infer(request, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not ready" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata() or ())["retry-after"] == "1"
    assert metric(metrics.render()[0].decode(), "backend_requests_total", protocol="grpc",
                  status="503") == 1
