"""The backend over real sockets with the real MiniLM model (ONNX Runtime on the CPU).

One model session is loaded per test session (``conftest.py``) and shared by every app the tests
start; most tests use one shared app. Tests that need other batching settings start their own
app around the same session (cheap: no model load).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient

from backend.model import EmbeddingModel
from tests.backend.serving import infer_body, metric, serving

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

LONG = "the quick brown fox jumps over the lazy dog " * 40  # past 256 tokens


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(models: list[EmbeddingModel]) -> AsyncIterator[TestClient[Any, Any]]:
    async with serving(models) as started:
        yield started


async def infer(client: TestClient[Any, Any], texts: list[str], *,
                headers: dict[str, str] | None = None, **extra: Any) -> Any:
    response = await client.post("/v2/models/minilm/infer", json=infer_body(texts, **extra),
                                 headers=headers)
    assert response.status == 200, await response.text()
    return response, await response.json()


_DTYPES = {"FP32": "<f4", "INT32": "<i4"}


async def read_answer(response: Any) -> dict[str, Any]:
    """An infer answer as JSON; binary outputs (Triton's extension) decoded into ``data``."""
    raw = await response.read()
    length = response.headers.get("Inference-Header-Content-Length")
    if length is None:
        assert response.content_type == "application/json"
        answer: dict[str, Any] = orjson.loads(raw)
        return answer
    assert response.content_type == "application/octet-stream"
    answer = orjson.loads(raw[:int(length)])
    offset = int(length)
    for output in answer["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            assert "data" not in output
            chunk = raw[offset:offset + size]
            output["data"] = np.frombuffer(chunk, dtype=_DTYPES[output["datatype"]]).tolist()
            offset += size
    assert offset == len(raw)  # nothing left over
    return answer


def embeddings_of(body: dict[str, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    (output,) = [o for o in body["outputs"] if o["name"] == "embedding"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


async def test_infer_matches_the_reference_embeddings(
    client: TestClient[Any, Any], reference: dict[str, Any]
) -> None:
    items = reference["items"]
    texts = [item["text"] for item in items]
    _, body = await infer(client, texts, id="ref-1")
    assert body["model_name"] == "minilm" and body["model_version"] == "1"
    assert body["id"] == "ref-1"
    got = embeddings_of(body)
    assert got.shape == (len(texts), 384)
    assert body["outputs"][0]["datatype"] == "FP32"
    want = np.asarray([item["embedding"] for item in items], dtype=np.float64)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.9999, cosine


async def test_timing_is_reported_and_request_id_echoed(client: TestClient[Any, Any]) -> None:
    response, body = await infer(client, ["hello"], headers={"X-Request-Id": "req-7"})
    assert response.headers["X-Request-Id"] == "req-7"
    timing = response.headers["Server-Timing"]
    assert timing.startswith("queue;dur=") and ", compute;dur=" in timing
    params = body["parameters"]
    assert params["queue_time_ms"] >= 0 and params["compute_time_ms"] > 0
    assert params["batch_size"] == 1
    assert "X-Request-Id" in (await client.get("/v2/health/live")).headers


async def test_metadata_and_health_routes(client: TestClient[Any, Any],
                                          models: list[EmbeddingModel]) -> None:
    # The identity of the graph actually served: the file of the variant the runtime loaded.
    config, variant = models[0].config, models[0].runtime.variant
    served_sha256 = hashlib.sha256(config.variant_path(variant).read_bytes()).hexdigest()
    server = await (await client.get("/v2")).json()
    assert server["name"] == "edge-backend" and isinstance(server["extensions"], list)
    assert "version" in server
    assert await (await client.get("/v2/health/live")).json() == {"live": True}
    ready = await client.get("/v2/health/ready")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    for path in ("/v2/models/minilm", "/v2/models/minilm/versions/1"):
        meta = await (await client.get(path)).json()
        assert meta == {
            "name": "minilm", "versions": ["1"], "platform": "onnxruntime_onnx",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]},
                        {"name": "token_count", "datatype": "INT32", "shape": [-1]}],
            "parameters": {"model_sha256": served_sha256},
        }
        model_ready = await client.get(path + "/ready")
        assert await model_ready.json() == {"name": "minilm", "ready": True}
    _, body = await infer_versioned(client)
    assert body["model_version"] == "1"


async def infer_versioned(client: TestClient[Any, Any]) -> Any:
    response = await client.post("/v2/models/minilm/versions/1/infer", json=infer_body(["a"]))
    assert response.status == 200
    return response, await response.json()


async def test_outputs_filter_and_row_major_nested_input(client: TestClient[Any, Any]) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1],
                        "data": [["first"], ["second"]]}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}]}
    response = await client.post("/v2/models/minilm/infer", json=body)
    assert response.status == 200
    assert response.headers["Inference-Header-Content-Length"]  # binary_data asked for
    answer = await read_answer(response)
    assert embeddings_of(answer).shape == (2, 384)
    assert [o["name"] for o in answer["outputs"]] == ["embedding"]
    assert answer["outputs"][0]["parameters"] == {"binary_data_size": 2 * 384 * 4}
    body["outputs"] = [{"name": "token_count"}]
    response = await client.post("/v2/models/minilm/infer", json=body)
    (counts,) = (await response.json())["outputs"]
    assert counts == {"name": "token_count", "datatype": "INT32", "shape": [2], "data": [3, 3]}
    body["outputs"] = []
    response = await client.post("/v2/models/minilm/infer", json=body)
    assert (await response.json())["outputs"] == []


async def test_standard_client_bodies_without_json_content_type(
    client: TestClient[Any, Any],
) -> None:
    raw = orjson.dumps(infer_body(["x"]))
    for headers in ({}, {"Content-Type": "application/octet-stream"}):
        response = await client.post("/v2/models/minilm/infer", data=raw, headers=headers)
        assert response.status == 200, await response.text()
    # tritonclient's default: BYTES input in Triton's binary extension after the JSON header.
    texts = ["x", "naïve café"]
    binary = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    header = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                       "parameters": {"binary_data_size": len(binary)}}],
                           "outputs": [{"name": "embedding",
                                        "parameters": {"binary_data": True}}]})
    response = await client.post(
        "/v2/models/minilm/infer", data=header + binary,
        headers={"Inference-Header-Content-Length": str(len(header)),
                 "Content-Type": "application/octet-stream"},
    )
    assert response.status == 200, await response.text()
    _, plain = await infer(client, texts)
    assert np.allclose(embeddings_of(await read_answer(response)), embeddings_of(plain),
                       atol=1e-5)


async def test_binary_inputs_with_json_outputs_and_sizes_that_do_not_add_up(
    client: TestClient[Any, Any],
) -> None:
    texts = ["binary in, JSON out", "ünïcödé ✓"]
    binary = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)

    async def post(size: int, tail: bytes = b"", length: str | None = None) -> Any:
        header = orjson.dumps({"id": "bin-1", "inputs": [{
            "name": "text", "datatype": "BYTES", "shape": [2],
            "parameters": {"binary_data_size": size}}]})
        return await client.post(
            "/v2/models/minilm/infer", data=header + binary + tail,
            headers={"Inference-Header-Content-Length": length or str(len(header)),
                     "Content-Type": "application/octet-stream"})

    response = await post(len(binary))
    assert response.status == 200, await response.text()
    assert response.content_type == "application/json"  # no binary output asked for
    answer = await response.json()
    _, plain = await infer(client, texts)
    assert answer["id"] == "bin-1"
    assert np.allclose(embeddings_of(answer), embeddings_of(plain), atol=1e-5)
    assert answer["outputs"][1]["data"] == plain["outputs"][1]["data"]  # token counts
    for bad, message in (
        (await post(len(binary) + 3), "runs past the binary data"),
        (await post(len(binary), tail=b"junk"), "add up to"),
        (await post(len(binary) - 1), "add up to"),
        (await post(len(binary), length="ten"), "must be an integer"),
        (await post(len(binary), length="100000"), "larger than the body"),
    ):
        assert bad.status == 400
        assert bad.content_type == "application/json"
        assert message in (await bad.json())["error"]


async def test_binary_outputs_on_request_match_json_outputs(
    client: TestClient[Any, Any],
) -> None:
    texts = ["the binary extension", "carries the same numbers"]
    _, plain = await infer(client, texts)
    every = await client.post("/v2/models/minilm/infer", json={
        **infer_body(texts), "parameters": {"binary_data_output": True}})
    answer = await read_answer(every)
    assert [o["name"] for o in answer["outputs"]] == ["embedding", "token_count"]
    assert all("binary_data_size" in o["parameters"] for o in answer["outputs"])
    assert np.array_equal(embeddings_of(answer), embeddings_of(plain))  # bit for bit
    assert answer["outputs"][1]["data"] == plain["outputs"][1]["data"]
    outputs = [{"name": "embedding", "parameters": {"binary_data": True}},
               {"name": "token_count"}]
    mixed = await client.post("/v2/models/minilm/infer",
                              json={**infer_body(texts), "outputs": outputs})
    answer = await read_answer(mixed)
    assert np.array_equal(embeddings_of(answer), embeddings_of(plain))
    assert answer["outputs"][1] == plain["outputs"][1]  # JSON, as asked
    for bad, message in (({"binary_data": "yes"}, "binary_data"), ([], "parameters")):
        response = await client.post("/v2/models/minilm/infer", json={
            **infer_body(texts), "outputs": [{"name": "embedding", "parameters": bad}]})
        assert response.status == 400
        assert message in (await response.json())["error"]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/v2/models/minilm/infer", b"{oops", {}, 400, "malformed JSON"),
        ("/v2/models/minilm/infer", b'{"inputs": ["\xff"]}', {}, 400, "UTF-8"),
        ("/v2/models/minilm/infer",
         orjson.dumps({"inputs": [{"name": "text", "datatype": "INT64", "shape": [1],
                                   "data": [1]}]}), {}, 400, "datatype"),
        ("/v2/models/minilm/infer",
         orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 2],
                                   "data": ["a", "b", "c", "d"]}]}), {}, 400, "shape"),
        ("/v2/models/minilm/infer", orjson.dumps(infer_body(["x"] * 257)), {}, 400,
         "too many items"),
        ("/v2/models/minilm/infer", b"x" * (1024 * 1024 + 1), {}, 413, "exceeds"),
        ("/v2/models/nope/infer", orjson.dumps(infer_body(["x"])), {}, 404, "unknown model"),
        ("/v2/models/minilm/versions/9/infer", orjson.dumps(infer_body(["x"])), {}, 404,
         "no version"),
        ("/v2/models/minilm/infer", orjson.dumps(infer_body(["x"])),
         {"Content-Type": "text/plain"}, 415, "content type"),
        ("/v2/models/minilm/infer", orjson.dumps(infer_body(["x"])),
         {"X-Request-Timeout-Ms": "soon"}, 400, "X-Request-Timeout-Ms"),
        ("/v2/nowhere", b"", {}, 404, "no route"),
    ],
)
async def test_bad_input_gets_a_json_error_and_the_server_keeps_serving(
    client: TestClient[Any, Any], path: str, body: bytes, headers: dict[str, str],
    status: int, message: str,
) -> None:
    headers = {"Content-Type": "application/json"} | headers
    response = await client.post(path, data=body, headers=headers)
    assert response.status == status
    error = (await response.json())["error"]
    assert isinstance(error, str) and message in error
    await infer(client, ["still serving"])


async def test_wrong_method_is_a_json_405(client: TestClient[Any, Any]) -> None:
    response = await client.get("/v2/models/minilm/infer")
    assert response.status == 405
    assert "error" in await response.json()


async def test_concurrent_requests_are_batched(client: TestClient[Any, Any]) -> None:
    results = await asyncio.gather(*(infer(client, [f"text number {i}"]) for i in range(24)))
    sizes = [body["parameters"]["batch_size"] for _, body in results]
    assert max(sizes) > 1, sizes


async def test_texts_split_across_batches_come_back_in_order(
    client: TestClient[Any, Any], models: list[EmbeddingModel]
) -> None:
    # Lengths vary so that length grouping reorders items inside batches.
    texts = [("word " * (1 + (i * 37) % 25)) + str(i) for i in range(40)]
    _, body = await infer(client, texts)
    got = embeddings_of(body)
    assert body["parameters"]["batch_size"] <= 32
    model = models[0]
    want = np.stack(model.compute(model.tokenize(texts)))
    assert np.min((got * want).sum(1)) >= 0.9999


async def test_the_forming_window_never_holds_a_request_that_finds_the_worker_idle(
    models: list[EmbeddingModel],
) -> None:
    # max_queue_delay_ms is the batch-forming window while work waits: a request that finds
    # the worker idle and nothing queued goes at once (a minute here: held, it would time out).
    async with serving(models, max_batch_size=4, max_queue_delay_ms=60_000) as client:
        _, alone = await asyncio.wait_for(infer(client, ["alone"]), timeout=30)
        _, again = await asyncio.wait_for(infer(client, ["alone again"]), timeout=30)
    assert alone["parameters"]["batch_size"] == again["parameters"]["batch_size"] == 1


async def test_the_forming_window_lets_a_backlog_fill_its_batch(
    models: list[EmbeddingModel],
) -> None:
    async with serving(models, max_batch_size=4, max_queue_delay_ms=300) as client:
        together = await asyncio.wait_for(
            asyncio.gather(*(infer(client, [f"t{i}"]) for i in range(9))), timeout=30
        )
    sizes = [body["parameters"]["batch_size"] for _, body in together]
    assert all(1 <= size <= 4 for size in sizes) and max(sizes) > 1, sizes


async def test_queue_full_answers_503_with_retry_after(models: list[EmbeddingModel]) -> None:
    async with serving(models, max_queue_size=2, max_batch_size=1) as client:
        body = orjson.dumps(infer_body([LONG, LONG]))
        responses = await asyncio.gather(*(
            client.post("/v2/models/minilm/infer", data=body) for _ in range(12)
        ))
        statuses = sorted(r.status for r in responses)
        assert set(statuses) == {200, 503}, statuses
        shed = next(r for r in responses if r.status == 503)
        assert int(shed.headers["Retry-After"]) >= 1
        assert "queue full" in (await shed.json())["error"]
        await infer(client, ["after the burst"])
        text = await (await client.get("/metrics")).text()
        assert metric(text, "backend_requests_total", model="minilm", status="503") >= 1


async def test_a_request_the_work_ahead_would_outlast_is_refused_at_once_never_computed(
    models: list[EmbeddingModel],
) -> None:
    async with serving(models, max_batch_size=2) as client:
        before = metric(await (await client.get("/metrics")).text(), "backend_batch_size_sum")
        big = asyncio.create_task(infer(client, [LONG] * 4))
        for _ in range(500):  # until the big request's second batch is waiting
            text = await (await client.get("/metrics")).text()
            if metric(text, "backend_queue_depth", model="minilm") > 0:
                break
            await asyncio.sleep(0.002)
        # Its 20 ms are less than the big request's batches still to run (2 x 256 tokens
        # each, at the cost learned in warm-up): told at once, not when the 20 ms are up.
        late = await client.post("/v2/models/minilm/infer", json=infer_body(["late"]),
                                 headers={"X-Request-Timeout-Ms": "20"})
        assert late.status == 503 and int(late.headers["Retry-After"]) >= 1
        assert "deadline" in (await late.json())["error"]
        await big
        text = await (await client.get("/metrics")).text()
        after = metric(text, "backend_batch_size_sum")
        assert after - before == 4  # the big request's texts only
        assert metric(text, "backend_requests_rejected_total", model="minilm", priority="2",
                      reason="deadline") == 1


async def test_not_ready_while_warming_up(models: list[EmbeddingModel]) -> None:
    async with serving(models, wait_ready=False, warmup_lengths=(128, 256),
                       warmup_batch_sizes=(1, 4)) as client:
        first = await client.get("/v2/health/ready")
        assert first.status == 503
        assert (await first.json())["ready"] is False
        assert (await client.get("/v2/models/minilm/ready")).status == 503
        early = await client.post("/v2/models/minilm/infer", json=infer_body(["x"]))
        assert early.status == 503 and "Retry-After" in early.headers
        assert (await client.get("/v2/health/live")).status == 200
        for _ in range(600):
            if (await client.get("/v2/health/ready")).status == 200:
                break
            await asyncio.sleep(0.05)
        await infer(client, ["warm now"])


async def test_openai_embeddings_float_and_base64(
    client: TestClient[Any, Any], models: list[EmbeddingModel]
) -> None:
    texts = ["a short one", "and a somewhat longer sentence to embed"]
    plain = await client.post("/v1/embeddings", json={"model": "minilm", "input": texts})
    assert plain.status == 200 and "Server-Timing" in plain.headers
    body = await plain.json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [d["index"] for d in body["data"]] == [0, 1]
    tokens = sum(len(ids) for ids in models[0].tokenize(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    packed = await (await client.post("/v1/embeddings", json={
        "model": "minilm", "input": texts, "encoding_format": "base64"})).json()
    for item, want in zip(packed["data"], body["data"], strict=True):
        vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert vector.shape == (384,)
        assert np.allclose(vector, want["embedding"], atol=1e-6)
    one = await (await client.post("/v1/embeddings", json={"model": "minilm",
                                                             "input": "solo"})).json()
    assert len(one["data"]) == 1


async def test_openai_errors_use_openai_shape(client: TestClient[Any, Any]) -> None:
    response = await client.post("/v1/embeddings", json={"model": "gpt", "input": "x"})
    assert response.status == 404
    error = (await response.json())["error"]
    assert "unknown model" in error["message"] and error["type"] == "invalid_request_error"
    response = await client.post("/v1/embeddings", json={"model": "minilm", "input": [1, 2]})
    assert response.status == 400


async def test_metrics_are_exposed(client: TestClient[Any, Any]) -> None:
    await infer(client, ["count me"])
    assert (await client.post("/v2/models/ghost/infer", json=infer_body(["x"]))).status == 404
    response = await client.get("/metrics")
    assert response.status == 200 and response.content_type == "text/plain"
    text = await response.text()
    assert metric(text, "backend_requests_total", model="minilm", status="200") >= 1
    assert metric(text, "backend_requests_total", model="unknown", status="404") >= 1
    for name in ("backend_queue_seconds_count", "backend_compute_seconds_count",
                 "backend_batch_size_count"):
        assert metric(text, name, model="minilm") >= 1, name
    assert "backend_queue_depth" in text


async def test_logs_never_hold_request_text(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    secret = "my-secret-passphrase-4711"
    with caplog.at_level(logging.DEBUG):
        await infer(client, [secret])
        await client.post("/v2/models/minilm/infer", data=b'{"inputs": "' + secret.encode())
    assert caplog.records, "the access log should have logged the requests"
    assert all(secret not in str(record.__dict__) for record in caplog.records)
