"""The gateway in front of a real backend: caching, merging, coalescing, headers."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from tests.gateway.conftest import BackendProc, GatewayFactory, metric_value
from tests.gateway.pipeline.rig import WallClock


def vectors(body: dict[str, Any]) -> np.ndarray:
    return np.array([row["embedding"] for row in body["data"]], dtype=np.float32)


async def post(client: Any, path: str, body: Any, **headers: str) -> tuple[int, Any, Any]:
    resp = await client.post(path, json=body, headers=headers)
    return resp.status, await resp.json(), resp.headers


async def test_hit_after_miss(gateway: GatewayFactory, backend: BackendProc,
                              reference: dict[str, Any]) -> None:
    client = await gateway()
    item = reference["items"][0]  # type: ignore[index]
    body = {"model": "minilm", "input": item["text"]}
    before = backend.requests_total()
    status, first, headers = await post(client, "/v1/embeddings", body)
    assert status == 200, first
    assert headers["X-Cache"] == "MISS"
    assert "compute;dur=" in headers["Server-Timing"] and "total;dur=" in headers["Server-Timing"]
    status, second, headers = await post(client, "/v1/embeddings", body)
    assert headers["X-Cache"] == "HIT"
    assert int(headers["Age"]) >= 0
    assert first["data"] == second["data"]
    assert backend.requests_total() == before + 1
    got = vectors(first)[0]
    want = np.array(item["embedding"], dtype=np.float32)
    assert float(got @ want / np.linalg.norm(want)) >= 0.9999
    assert first["object"] == "list" and first["model"] == "minilm"
    assert first["data"][0]["object"] == "embedding" and first["data"][0]["index"] == 0
    assert first["usage"]["prompt_tokens"] > 0
    assert first["usage"]["total_tokens"] == first["usage"]["prompt_tokens"]


async def test_per_item_merge_equals_uncached(gateway: GatewayFactory,
                                              backend: BackendProc) -> None:
    client = await gateway()
    warm = ["alpha particles decay", "the red fox jumps"]
    mixed = ["a brand new sentence", warm[0], "another unseen text here", warm[1], warm[0]]
    status, _, headers = await post(client, "/v1/embeddings", {"model": "minilm", "input": warm})
    assert status == 200 and headers["X-Cache"] == "MISS"
    before = backend.requests_total()
    status, merged, headers = await post(client, "/v1/embeddings",
                                         {"model": "minilm", "input": mixed})
    assert status == 200 and headers["X-Cache"] == "MISS"
    # Only the two unseen texts went to the backend, in one call.
    assert backend.requests_total() == before + 1
    status, plain, headers = await post(client, "/v1/embeddings",
                                        {"model": "minilm", "input": mixed},
                                        **{"Cache-Control": "no-store"})
    assert headers["X-Cache"] == "BYPASS"
    assert [r["index"] for r in merged["data"]] == list(range(len(mixed)))
    np.testing.assert_allclose(vectors(merged), vectors(plain), atol=2e-5)
    assert merged["usage"] == plain["usage"]


async def test_identical_concurrent_requests_make_one_backend_call(
        gateway: GatewayFactory, backend: BackendProc) -> None:
    client = await gateway()
    body = {"model": "minilm", "input": "fifty clients ask the very same question"}
    before = backend.requests_total()
    results = await asyncio.gather(*(post(client, "/v1/embeddings", body) for _ in range(50)))
    assert all(status == 200 for status, _, _ in results)
    caches = [h["X-Cache"] for _, _, h in results]
    assert caches.count("MISS") == 1
    assert set(caches) <= {"MISS", "COALESCED", "HIT"}
    assert "COALESCED" in caches
    assert backend.requests_total() == before + 1
    assert all(r[1]["data"] == results[0][1]["data"] for r in results)
    metrics = await (await client.get("/metrics")).text()
    assert metric_value(metrics, "gateway_coalesced_total") >= caches.count("COALESCED")


async def test_base64_encoding(gateway: GatewayFactory) -> None:
    client = await gateway()
    status, floats, _ = await post(client, "/v1/embeddings",
                                   {"model": "minilm", "input": ["base64 please"]})
    status, b64, _ = await post(client, "/v1/embeddings",
                                {"model": "minilm", "input": ["base64 please"],
                                 "encoding_format": "base64"})
    assert status == 200
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, vectors(floats)[0])


async def test_model_alias_and_dimensions(gateway: GatewayFactory) -> None:
    client = await gateway()
    status, body, _ = await post(client, "/v1/embeddings",
                                 {"model": "sentence-transformers/all-MiniLM-L6-v2",
                                  "input": "alias", "dimensions": 64})
    assert status == 200
    vec = vectors(body)[0]
    assert vec.shape == (64,)
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"


async def test_cache_control(gateway: GatewayFactory, backend: BackendProc) -> None:
    clock = WallClock()
    client = await gateway(clock=clock)
    body = {"model": "minilm", "input": "cache control semantics"}
    await post(client, "/v1/embeddings", body)
    before = backend.requests_total()
    _, _, h = await post(client, "/v1/embeddings", body, **{"Cache-Control": "no-cache"})
    assert h["X-Cache"] == "MISS"  # refreshed from the backend, and stored again
    assert backend.requests_total() == before + 1
    _, _, h = await post(client, "/v1/embeddings", body, **{"Cache-Control": "max-age=3600"})
    assert h["X-Cache"] == "HIT"
    clock.advance(1.1)
    _, _, h = await post(client, "/v1/embeddings", body, **{"Cache-Control": "max-age=0"})
    assert h["X-Cache"] == "MISS"
    # no-store: neither read nor written.
    fresh = {"model": "minilm", "input": "never stored at all"}
    _, _, h = await post(client, "/v1/embeddings", fresh, **{"Cache-Control": "no-store"})
    assert h["X-Cache"] == "BYPASS"
    _, _, h = await post(client, "/v1/embeddings", fresh)
    assert h["X-Cache"] == "MISS"


async def test_request_id_is_propagated(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": "rid"},
                             headers={"X-Request-Id": "req-123"})
    assert resp.headers["X-Request-Id"] == "req-123"
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": "rid"})
    assert len(resp.headers["X-Request-Id"]) == 32


async def test_classify_and_rank(gateway: GatewayFactory) -> None:
    client = await gateway()
    status, body, headers = await post(client, "/v1/classify", {
        "model": "minilm",
        "input": ["I cannot log in to my account", "The stock market fell today"],
        "labels": ["finance", "account access", "cooking"],
    })
    assert status == 200, body
    assert body["data"][0]["labels"][0]["label"] == "account access"
    assert body["data"][1]["labels"][0]["label"] == "finance"
    scores = [row["score"] for row in body["data"][0]["labels"]]
    assert scores == sorted(scores, reverse=True)
    probs = [row["probability"] for row in body["data"][0]["labels"]]
    assert abs(sum(probs) - 1.0) < 1e-3
    status, body, headers = await post(client, "/v1/rank", {
        "model": "minilm", "query": "how do I reset my password?",
        "documents": ["Bake the bread at 200 degrees", "Password reset: click 'forgot password'",
                      "Quarterly earnings rose"],
        "top_n": 2, "return_documents": True,
    })
    assert status == 200, body
    assert body["results"][0]["index"] == 1
    assert len(body["results"]) == 2
    assert body["results"][0]["relevance_score"] >= body["results"][1]["relevance_score"]
    assert body["results"][0]["document"]["text"].startswith("Password reset")
    # The same texts are now cached per item: a second rank is a hit.
    status, _, headers = await post(client, "/v1/rank", {
        "model": "minilm", "query": "how do I reset my password?",
        "documents": ["Bake the bread at 200 degrees", "Password reset: click 'forgot password'",
                      "Quarterly earnings rose"]})
    assert headers["X-Cache"] == "HIT"


@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/classify", "/v1/rank"])
async def test_metrics_count_requests(gateway: GatewayFactory, route: str) -> None:
    client = await gateway()
    await client.post(route, data=b"{", headers={"Content-Type": "application/json"})
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gateway_requests_total", route=route, status="400") == 1


async def test_metrics_label_requests_by_route_pattern_and_unmatched(
        gateway: GatewayFactory) -> None:
    # Route labels are kept per route (middleware._LABELS); a 404 or 405 is a new system route
    # each time and is labelled "unmatched" without being kept.
    from gateway.http import middleware
    client = await gateway()
    oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    for _ in range(2):
        assert (await client.post("/v2/models/minilm/infer", json=oip)).status == 200
    kept = len(middleware._LABELS)
    for i in range(5):
        assert (await client.get(f"/no/such/path/{i}")).status == 404
    assert (await client.get("/v1/embeddings")).status == 405
    assert len(middleware._LABELS) == kept
    text = await (await client.get("/metrics")).text()
    oip_lines = [line for line in text.splitlines() if line.startswith(
        "gateway_requests_total{") and 'route="/v2/models/{name}/infer",status="200"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in oip_lines) == 2  # MISS, HIT
    assert metric_value(text, "gateway_requests_total", route="unmatched", status="404") == 5
    assert metric_value(text, "gateway_requests_total", route="unmatched", status="405") == 1
