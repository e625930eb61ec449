"""Regression tests for what the API fuzzer (tests/gateway/http/test_fuzz.py, make fuzz) found."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import GatewayFactory


async def test_an_unknown_model_version_is_a_404_in_the_gateways_shape(
        gateway: GatewayFactory) -> None:
    client = await gateway()
    for path in ("/v2/models/minilm/versions/0", "/v2/models/minilm/versions/999"):
        resp = await client.get(path)
        assert resp.status == 404
        body = await resp.json()
        assert body["error"]["type"] == "model_not_found"
        assert body["error"]["request_id"] == resp.headers["X-Request-Id"]
    resp = await client.get("/v2/models/minilm")
    assert resp.status == 200 and (await resp.json())["name"] == "minilm"


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/embeddings", {"model": "minilm", "input": "x", "user": None}, "user"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "user": 7}, "user"),
    ("/v1/classify", {"model": "minilm", "input": "x", "labels": ["a", "b"],
                      "multi_label": "yes"}, "multi_label"),
])
async def test_fields_of_the_wrong_type_are_refused(gateway: GatewayFactory, path: str,
                                                    body: dict[str, Any], field: str) -> None:
    client = await gateway()
    resp = await client.post(path, json=body)
    assert resp.status == 422
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request" and error["message"].startswith(field)
