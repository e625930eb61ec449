"""The gateway in front of real backends reached over gRPC (``grpc://``): caching, the OIP
passthrough and metadata routes, and failover work as over REST."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import free_port
from tests.gateway.conftest import (
    BackendProc,
    GatewayFactory,
    metric_value,
    start_backend,
    stop_process,
)

NO_STORE = {"Cache-Control": "no-store"}


@dataclass
class GrpcBackend:
    """A real backend process serving REST on ``proc.url`` and gRPC on ``grpc_url``."""

    proc: BackendProc
    grpc_url: str

    def grpc_calls(self, **labels: str) -> float:
        text = httpx.get(f"{self.proc.url}/metrics", timeout=5).text
        return metric_value(text, "backend_requests_total", protocol="grpc", **labels)


def start_grpc_backend(models_dir: Path, **where: str) -> GrpcBackend:
    port = free_port()
    proc = start_backend(models_dir, extra=("--grpc-port", str(port)), **where)
    return GrpcBackend(proc, f"grpc://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def both(models_dir: Path) -> Iterator[GrpcBackend]:
    """One backend for the module, reached over gRPC by one gateway and REST by another."""
    made = start_grpc_backend(models_dir)
    try:
        yield made
    finally:
        stop_process(made.proc.proc)


def embedding(body: dict[str, Any]) -> np.ndarray:
    return np.array(body["data"][0]["embedding"], dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_a_miss_then_a_hit_over_grpc_equals_the_rest_path(
    gateway: GatewayFactory, both: GrpcBackend, reference: dict[str, Any]
) -> None:
    over_grpc = await gateway(backends=[both.grpc_url])
    over_rest = await gateway(backends=[both.proc.url])
    item = reference["items"][1]  # type: ignore[index]
    body = {"model": "minilm", "input": item["text"]}
    calls = both.grpc_calls()

    first = await over_grpc.post("/v1/embeddings", json=body)
    assert first.status == 200, await first.text()
    assert first.headers["X-Cache"] == "MISS"
    # The backend's queue and compute came back in the trailing metadata.
    assert "compute;dur=" in first.headers["Server-Timing"]
    second = await over_grpc.post("/v1/embeddings", json=body)
    assert second.headers["X-Cache"] == "HIT"
    assert both.grpc_calls() == calls + 1, "the HIT must not reach the backend"
    grpc_body, hit_body = await first.json(), await second.json()
    assert hit_body["data"] == grpc_body["data"]

    rest = await over_rest.post("/v1/embeddings", json=body)
    assert rest.status == 200 and rest.headers["X-Cache"] == "MISS"
    rest_body = await rest.json()
    assert both.grpc_calls() == calls + 1, "the REST gateway must not use gRPC"
    assert cosine(embedding(grpc_body), embedding(rest_body)) > 0.9999
    want = np.array(item["embedding"], dtype=np.float32)
    assert cosine(embedding(grpc_body), want) > 0.9999
    assert grpc_body["usage"] == rest_body["usage"]  # token counts came through too
    assert grpc_body["usage"]["prompt_tokens"] > 0


async def test_many_texts_in_one_miss_keep_their_order(gateway: GatewayFactory,
                                                       both: GrpcBackend) -> None:
    over_grpc = await gateway(backends=[both.grpc_url])
    over_rest = await gateway(backends=[both.proc.url])
    texts = [f"sentence number {i} about {'ünïcode ' * (i % 3)}caching" for i in range(12)]
    body = {"model": "minilm", "input": texts}
    got = await (await over_grpc.post("/v1/embeddings", json=body, headers=NO_STORE)).json()
    want = await (await over_rest.post("/v1/embeddings", json=body, headers=NO_STORE)).json()
    assert [row["index"] for row in got["data"]] == list(range(12))
    for mine, theirs in zip(got["data"], want["data"], strict=True):
        assert cosine(np.array(mine["embedding"]), np.array(theirs["embedding"])) > 0.9999


def infer_body(texts: list[str], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}], **extra}


async def test_oip_infer_and_metadata_pass_through_over_grpc(gateway: GatewayFactory,
                                                             both: GrpcBackend) -> None:
    over_grpc = await gateway(backends=[both.grpc_url])
    over_rest = await gateway(backends=[both.proc.url])
    request = infer_body(["passthrough over grpc"], id="mine",
                         parameters={"binary_data_output": True})
    resp = await over_grpc.post("/v2/models/minilm/infer", json=request)
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-Cache"] == "MISS"
    got = await resp.json()  # JSON although binary outputs were asked for, as over REST
    assert got["id"] == "mine" and got["model_name"] == "minilm"
    again = await over_grpc.post("/v2/models/minilm/infer", json={**request, "id": "other"})
    assert again.headers["X-Cache"] == "HIT" and (await again.json())["id"] == "other"
    want = await (await over_rest.post("/v2/models/minilm/infer", json=request)).json()
    assert [o["name"] for o in got["outputs"]] == [o["name"] for o in want["outputs"]]
    for mine, theirs in zip(got["outputs"], want["outputs"], strict=True):
        assert (mine["datatype"], mine["shape"]) == (theirs["datatype"], theirs["shape"])
    vector = np.array(got["outputs"][0]["data"], np.float32)
    assert cosine(vector, np.array(want["outputs"][0]["data"], np.float32)) > 0.9999
    assert got["outputs"][1]["data"] == want["outputs"][1]["data"]  # token counts

    # Only the outputs asked for; a bad one is the backend's 400 (INVALID_ARGUMENT), its message.
    only = await over_grpc.post("/v2/models/minilm/infer", json=infer_body(
        ["just counts"], outputs=[{"name": "token_count"}]))
    assert only.status == 200
    assert [o["name"] for o in (await only.json())["outputs"]] == ["token_count"]
    bad = await over_grpc.post("/v2/models/minilm/infer", json=infer_body(
        ["x"], outputs=[{"name": "logits"}]))
    assert bad.status == 400
    assert "logits" in (await bad.text())

    meta = await over_grpc.get("/v2/models/minilm")
    assert meta.status == 200
    rest = await (await over_rest.get("/v2/models/minilm")).json()
    # The gRPC ModelMetadataResponse has no parameters field (KServe's and Triton's protos
    # alike): the graph's identity (parameters.model_sha256) travels over REST only.
    assert "model_sha256" in rest.pop("parameters")
    assert await meta.json() == rest
    assert (await over_grpc.get("/v2/models/minilm/versions/1")).status == 200
    missing = await over_grpc.get("/v2/models/minilm/versions/9")
    assert missing.status == 404


@pytest.fixture
def grpc_near_rest_far(models_dir: Path) -> Iterator[tuple[GrpcBackend, BackendProc]]:
    near = start_grpc_backend(models_dir, zone="zone-a", region="r1")
    try:
        far = start_backend(models_dir, zone="zone-b", region="r1")
    except BaseException:
        stop_process(near.proc.proc)
        raise
    try:
        yield near, far
    finally:
        stop_process(near.proc.proc)
        stop_process(far.proc)


async def test_a_killed_grpc_backend_fails_over_to_a_rest_one_with_no_failed_request(
    gateway: GatewayFactory, grpc_near_rest_far: tuple[GrpcBackend, BackendProc]
) -> None:
    near, far = grpc_near_rest_far
    client = await gateway(backends=[f"{near.grpc_url}@r1/zone-a", f"{far.url}@r1/zone-b"],
                           routing={"region": "r1", "zone": "zone-a",
                                    "health_interval_s": 0.2})
    failures: list[int] = []

    async def one(i: int) -> None:
        resp = await client.post("/v1/embeddings", headers=NO_STORE,
                                 json={"model": "minilm", "input": f"failover item {i}"})
        if resp.status != 200:
            failures.append(resp.status)

    for i in range(20):
        await one(i)
    assert near.grpc_calls(status="200") >= 20, "the near backend is reached over gRPC"
    assert far.requests_total() == 0, "the far zone must not be used while the near one is up"

    near.proc.proc.kill()  # mid-stream, no goodbye: the channel's connection just dies
    near.proc.proc.wait()
    for i in range(20, 80):
        await one(i)
    assert failures == [], f"requests failed during failover: {failures}"
    assert far.requests_total() == 60, "every request after the kill is served by the far one"


async def test_the_backend_priority_travels_over_grpc_too(gateway: GatewayFactory,
                                                          both: GrpcBackend) -> None:
    over_grpc = await gateway(backends=[both.grpc_url])

    def served(priority: str) -> float:
        text = httpx.get(f"{both.proc.url}/metrics", timeout=5).text
        return metric_value(text, "backend_queue_duration_seconds_count", model="minilm",
                            priority=priority)

    before = served("1"), served("3")
    resp = await over_grpc.post("/v1/embeddings", headers=NO_STORE,
                                json={"model": "minilm", "input": "priority over grpc"})
    assert resp.status == 200
    resp = await over_grpc.post("/v2/models/minilm/infer", headers=NO_STORE, json=infer_body(
        ["lowered over grpc"], parameters={"priority": 3, "fairness_key": "forged"}))
    assert resp.status == 200, await resp.text()
    assert (served("1"), served("3")) == (before[0] + 1, before[1] + 1)
