"""Without a Redis for batches, every batch route answers 503 in the gateway's error shape and
names the setting to configure; the interactive routes are untouched."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import GatewayFactory

ROUTES = [("POST", "/v1/files"), ("GET", "/v1/files/file-000000000000000000000000"),
          ("GET", "/v1/files/file-000000000000000000000000/content"),
          ("DELETE", "/v1/files/file-000000000000000000000000"), ("POST", "/v1/batches"),
          ("GET", "/v1/batches"), ("GET", "/v1/batches/batch_000000000000000000000000"),
          ("POST", "/v1/batches/batch_000000000000000000000000/cancel")]


@pytest.mark.parametrize(("settings", "words"), [
    ({}, "redis.url (GATEWAY_REDIS_URL)"),
    ({"redis.url": "redis://127.0.0.1:9/0", "batch.enabled": False}, "batch.enabled"),
])
async def test_batch_routes_say_what_to_configure(gateway: GatewayFactory,
                                                  settings: dict[str, object],
                                                  words: str) -> None:
    client = await gateway(**settings)
    for method, path in ROUTES:
        resp = await client.request(method, path)
        body = await resp.json()
        assert resp.status == 503, (path, body)
        assert body["error"]["type"] == "batch_unavailable"
        assert words in body["error"]["message"]
        assert body["error"]["request_id"] == resp.headers["X-Request-Id"]
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": "still here"})
    assert resp.status == 200
