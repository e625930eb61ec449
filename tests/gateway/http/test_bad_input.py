"""Every bad input gets its status and the one JSON error shape; none reaches the backend."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import BackendProc, GatewayFactory

LONG = "x" * (2 * 1024 * 1024)

CASES: list[tuple[str, str, Any, dict[str, str], int, str]] = [
    # (name, route, body (bytes or JSON-able), headers, status, error type)
    ("wrong content type", "/v1/embeddings", b'{"model":"minilm","input":"a"}',
     {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    ("no content type", "/v1/embeddings", b'{"model":"minilm","input":"a"}', {}, 415,
     "unsupported_media_type"),
    ("malformed json", "/v1/embeddings", b'{"model": "minilm", "input": ',
     {"Content-Type": "application/json"}, 400, "invalid_json"),
    ("body too large", "/v1/embeddings", b'{"model":"minilm","input":"' + LONG.encode() + b'"}',
     {"Content-Type": "application/json"}, 413, "payload_too_large"),
    ("not an object", "/v1/embeddings", [1, 2], {}, 422, "invalid_request"),
    ("missing model", "/v1/embeddings", {"input": "a"}, {}, 422, "invalid_request"),
    ("missing input", "/v1/embeddings", {"model": "minilm"}, {}, 422, "invalid_request"),
    ("empty input list", "/v1/embeddings", {"model": "minilm", "input": []}, {}, 422,
     "invalid_request"),
    ("number in input", "/v1/embeddings", {"model": "minilm", "input": ["a", 3]}, {}, 422,
     "invalid_request"),
    ("token arrays", "/v1/embeddings", {"model": "minilm", "input": [[1, 2, 3]]}, {}, 422,
     "invalid_request"),
    ("bad encoding", "/v1/embeddings", {"model": "minilm", "input": "a", "encoding_format": "hex"},
     {}, 422, "invalid_request"),
    ("unknown field", "/v1/embeddings", {"model": "minilm", "input": "a", "temperature": 1}, {},
     422, "invalid_request"),
    ("too many items", "/v1/embeddings", {"model": "minilm", "input": ["t"] * 5000}, {}, 422,
     "invalid_request"),
    ("unknown model", "/v1/embeddings", {"model": "gpt-9", "input": "a"}, {}, 404,
     "model_not_found"),
    ("bad deadline", "/v1/embeddings", {"model": "minilm", "input": "a"},
     {"X-Request-Timeout-Ms": "soon"}, 400, "invalid_header"),
    ("classify no labels", "/v1/classify", {"model": "minilm", "input": "a"}, {}, 422,
     "invalid_request"),
    ("classify dup labels", "/v1/classify", {"model": "minilm", "input": "a",
                                             "labels": ["x", "x"]}, {}, 422, "invalid_request"),
    ("rank no documents", "/v1/rank", {"model": "minilm", "query": "q"}, {}, 422,
     "invalid_request"),
    ("rank bad top_n", "/v1/rank", {"model": "minilm", "query": "q", "documents": ["d"],
                                    "top_n": 0}, {}, 422, "invalid_request"),
    ("oip wrong datatype", "/v2/models/minilm/infer",
     {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, {}, 422,
     "invalid_request"),
    ("oip shape mismatch", "/v2/models/minilm/infer",
     {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}, {}, 422,
     "invalid_request"),
    ("oip no inputs", "/v2/models/minilm/infer", {"inputs": []}, {}, 422, "invalid_request"),
    ("oip unknown model", "/v2/models/nope/infer",
     {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}, {}, 404,
     "model_not_found"),
]


@pytest.mark.parametrize(("name", "route", "body", "headers", "status", "etype"), CASES,
                         ids=[c[0] for c in CASES])
async def test_bad_input(gateway: GatewayFactory, backend: BackendProc, name: str, route: str,
                         body: Any, headers: dict[str, str], status: int, etype: str) -> None:
    client = await gateway()
    before = backend.requests_total()
    if isinstance(body, bytes):
        resp = await client.post(route, data=body, headers=headers)
    else:
        resp = await client.post(route, json=body, headers=headers)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    err = (await resp.json())["error"]
    assert err["type"] == etype
    assert err["message"]
    assert err["request_id"] == resp.headers["X-Request-Id"]
    assert backend.requests_total() == before, "a bad request reached the backend"
    # The gateway keeps serving, and nothing bad was cached.
    ok = await client.post("/v1/embeddings", json={"model": "minilm", "input": "still fine"})
    assert ok.status == 200


async def test_validation_names_the_field(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": ["a", None]})
    assert resp.status == 422
    assert "input[1]" in (await resp.json())["error"]["message"]


async def test_unknown_route_and_method(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.get("/v1/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["type"] == "not_found"
    resp = await client.get("/v1/embeddings")
    assert resp.status == 405
    assert (await resp.json())["error"]["type"] == "method_not_allowed"
