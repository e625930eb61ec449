"""The gRPC upstream against backends that misbehave on purpose (an in-process ``grpc.aio``
server speaking OIP, where a real backend cannot be made to hang or shed at will): the request's
deadline is the gRPC deadline (504), a shed is a 503 with the backend's Retry-After and is
retried on the next backend, and the request id and try number go as metadata."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.settings import load_settings
from oip import inference_pb2 as pb
from tests.conftest import free_port
from tests.gateway.conftest import metric_value

Context = grpc.aio.ServicerContext[Any, Any]
NO_STORE = {"Cache-Control": "no-store"}
HANG_BOUND_S = 30.0  # a hanging call gives up by itself after this, whatever happens


@dataclass
class Seen:
    """One ModelInfer call as the server saw it."""

    metadata: dict[str, str]
    time_remaining: float | None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class FakeOip:
    """``inference.GRPCInferenceService`` on a loopback port: ready, version "1" of ``minilm``,
    and ModelInfer answered as ``mode`` says: ``ok``, ``hang`` or ``shed``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.port = free_port()
        self.calls: list[Seen] = []
        self._server = grpc.aio.server()

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self) -> None:
        def unary(method: Callable[..., Awaitable[Any]], request: Any, response: Any
                  ) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                method, request_deserializer=request.FromString,
                response_serializer=response.SerializeToString)

        self._server.add_registered_method_handlers("inference.GRPCInferenceService", {
            "ServerReady": unary(self._ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelMetadata": unary(self._metadata, pb.ModelMetadataRequest,
                                   pb.ModelMetadataResponse),
            "ModelInfer": unary(self._infer, pb.ModelInferRequest, pb.ModelInferResponse),
        })
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0)

    async def _ready(self, request: pb.ServerReadyRequest, context: Context
                     ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def _metadata(self, request: pb.ModelMetadataRequest, context: Context
                        ) -> pb.ModelMetadataResponse:
        return pb.ModelMetadataResponse(name=request.name, versions=["1"],
                                        platform="onnxruntime_onnx")

    async def _infer(self, request: pb.ModelInferRequest, context: Context
                     ) -> pb.ModelInferResponse:
        seen = Seen({k: v for k, v in context.invocation_metadata() or ()
                     if isinstance(v, str)}, context.time_remaining())
        self.calls.append(seen)
        rid = seen.metadata.get("x-request-id", "")
        if self.mode == "hang":
            try:
                await asyncio.sleep(HANG_BOUND_S)
            except asyncio.CancelledError:
                seen.cancelled.set()
                raise
        if self.mode == "shed":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full",
                                (("retry-after", "7"), ("x-request-id", rid)))
        n = int(request.inputs[0].shape[0])
        response = pb.ModelInferResponse(model_name="minilm", model_version="1")
        response.outputs.add(name="embedding", datatype="FP32", shape=[n, 4])
        response.raw_output_contents.append(np.full((n, 4), 0.5, "<f4").tobytes())
        context.set_trailing_metadata((("server-timing", "queue;dur=0.1, compute;dur=0.2"),
                                       ("x-request-id", rid)))
        return response


Gateway = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def fake_oip() -> AsyncIterator[Callable[[str], Awaitable[FakeOip]]]:
    made: list[FakeOip] = []

    async def make(mode: str) -> FakeOip:
        server = FakeOip(mode)
        made.append(server)
        await server.start()
        return server

    yield make
    for server in made:
        await server.stop()


@pytest.fixture
async def gateway_to(aiohttp_client: Any, tmp_path: Path) -> Gateway:
    """A gateway in front of the given backends only (no REST backend started)."""
    async def make(*backends: str, **overrides: Any) -> TestClient[Any, Any]:
        values: dict[str, Any] = {"backends": list(backends),
                                  "routing.health_interval_s": 0.5,
                                  "cache.node.path": str(tmp_path / "node"), **overrides}
        app = create_app(load_settings(None, values, environ={}), registry=CollectorRegistry())
        client: TestClient[Any, Any] = await aiohttp_client(TestServer(app))
        return client

    return make


async def embed(client: TestClient[Any, Any], text: str, **headers: str) -> Any:
    return await client.post("/v1/embeddings", json={"model": "minilm", "input": text},
                             headers={**NO_STORE, **headers})


async def test_the_request_deadline_is_the_grpc_deadline_and_passing_it_is_a_504(
    fake_oip: Callable[[str], Awaitable[FakeOip]], gateway_to: Gateway
) -> None:
    hanging = await fake_oip("hang")
    client = await gateway_to(hanging.url)
    resp = await embed(client, "never answered", **{"X-Request-Timeout-Ms": "300",
                                                   "X-Request-Id": "deadline-1"})
    assert resp.status == 504, await resp.text()
    (seen,) = hanging.calls
    assert seen.metadata["x-request-id"] == "deadline-1"
    assert seen.metadata["x-attempt-count"] == "1"
    assert seen.time_remaining is not None and 0 < seen.time_remaining <= 0.302
    # The gateway gave up on the call: the server sees it cancelled, not left running.
    async with asyncio.timeout(HANG_BOUND_S / 2):
        await seen.cancelled.wait()
    metrics = await (await client.get("/metrics")).text()
    # The client's deadline passed: not counted against the backend.
    assert metric_value(metrics, "gateway_backend_requests_total", outcome="cancelled") == 1
    assert metric_value(metrics, "gateway_backend_requests_total", outcome="timeout") == 0


async def test_a_shed_is_a_503_with_the_backends_retry_after(
    fake_oip: Callable[[str], Awaitable[FakeOip]], gateway_to: Gateway
) -> None:
    shedding = await fake_oip("shed")
    client = await gateway_to(shedding.url)
    resp = await embed(client, "too busy")
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "7"
    assert "overloaded" in (await resp.json())["error"]["message"]


async def test_a_shed_is_retried_on_the_next_backend_with_the_try_number(
    fake_oip: Callable[[str], Awaitable[FakeOip]], gateway_to: Gateway
) -> None:
    shedding, answering = await fake_oip("shed"), await fake_oip("ok")
    client = await gateway_to(f"{shedding.url}@r1/near", f"{answering.url}@r1/far",
                              routing={"region": "r1", "zone": "near"})
    for i in range(5):
        resp = await embed(client, f"retried {i}", **{"X-Request-Id": f"retry-{i}"})
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["data"][0]["embedding"] == [0.5] * 4
    assert [c.metadata["x-attempt-count"] for c in shedding.calls] == ["1"] * 5
    assert [c.metadata["x-attempt-count"] for c in answering.calls] == ["2"] * 5
    assert [c.metadata["x-request-id"] for c in answering.calls] == [
        f"retry-{i}" for i in range(5)]
    metrics = await (await client.get("/metrics")).text()
    assert metric_value(metrics, "gateway_upstream_retries_total", reason="http_503") == 5


async def test_a_grpc_backend_with_nothing_listening_is_unhealthy_at_once(
    fake_oip: Callable[[str], Awaitable[FakeOip]], gateway_to: Gateway
) -> None:
    answering = await fake_oip("ok")
    nothing = f"grpc://127.0.0.1:{free_port()}"
    # The first health round runs before the gateway takes traffic: a refused connection
    # counts at once, over gRPC as over REST.
    client = await gateway_to(f"{nothing}@r1/near", f"{answering.url}@r1/far",
                              routing={"region": "r1", "zone": "near"})
    for i in range(3):
        resp = await embed(client, f"skip {i}")
        assert resp.status == 200, await resp.text()
    metrics = await (await client.get("/metrics")).text()
    assert metric_value(metrics, "gateway_backend_healthy", zone="near") == 0
    assert len(answering.calls) == 3
