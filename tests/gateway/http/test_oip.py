"""OIP v2 through the gateway: cached infer, id echo, metadata and health passthrough."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from tests.gateway.conftest import BackendProc, GatewayFactory, metric_value


def infer_body(texts: list[str], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}], **extra}


async def test_infer_is_cached_and_id_echoed(gateway: GatewayFactory, backend: BackendProc,
                                             reference: dict[str, Any]) -> None:
    client = await gateway()
    item = reference["items"][2]  # type: ignore[index]
    before = backend.requests_total()
    resp = await client.post("/v2/models/minilm/infer",
                             json=infer_body([item["text"]], id="first",
                                             parameters={"b": 1, "a": 2}))
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-Cache"] == "MISS"
    first = await resp.json()
    assert first["id"] == "first"
    out = first["outputs"][0]
    assert out["datatype"] == "FP32" and out["shape"] == [1, 384]
    vec = np.array(out["data"], dtype=np.float32)
    want = np.array(item["embedding"], dtype=np.float32)
    assert float(vec @ want / np.linalg.norm(want)) >= 0.9999
    # Same request, other id and parameters in another order: the canonical form matches.
    resp = await client.post("/v2/models/minilm/infer",
                             json=infer_body([item["text"]], id="second",
                                             parameters={"a": 2, "b": 1}))
    assert resp.headers["X-Cache"] == "HIT"
    second = await resp.json()
    assert second["id"] == "second"
    assert second["outputs"] == first["outputs"]
    resp = await client.post("/v2/models/minilm/infer",
                             json=infer_body([item["text"]], parameters={"a": 2, "b": 1}))
    assert resp.headers["X-Cache"] == "HIT"
    assert "id" not in await resp.json()
    assert backend.requests_total() == before + 1


async def test_metadata_and_health(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.get("/v2/models/minilm")
    assert resp.status == 200
    meta = await resp.json()
    assert meta["name"] == "minilm" and meta["versions"]
    resp = await client.get("/v2/models/unknown")
    assert resp.status == 404
    assert (await client.get("/v2/health/ready")).status == 200
    assert (await client.get("/v2/health/live")).status == 200
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["policy_version"]


async def test_binary_output_requests_get_json_and_share_the_cache(
    gateway: GatewayFactory, backend: BackendProc
) -> None:
    """The backend answers binary outputs when asked; the gateway's OIP route asks it for JSON
    (what it caches and returns), so a client asking for binary data still gets a JSON answer it
    can read (tritonclient reads both) and shares the cache entry with plain requests."""
    client = await gateway()
    texts = ["binary outputs through the gateway"]
    before = backend.requests_total()
    resp = await client.post("/v2/models/minilm/infer", json=infer_body(
        texts, parameters={"binary_data_output": True},
        outputs=[{"name": "embedding", "parameters": {"binary_data": True}}]))
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "application/json"
    assert "Inference-Header-Content-Length" not in resp.headers
    first = await resp.json()
    (out,) = first["outputs"]
    assert out["shape"] == [1, 384] and len(out["data"]) == 384
    resp = await client.post("/v2/models/minilm/infer", json=infer_body(
        texts, outputs=[{"name": "embedding"}]))
    assert resp.headers["X-Cache"] == "HIT"
    assert (await resp.json())["outputs"] == first["outputs"]
    assert backend.requests_total() == before + 1


def backend_served(backend: BackendProc, priority: str) -> float:
    text = httpx.get(f"{backend.url}/metrics", timeout=5).text
    return metric_value(text, "backend_queue_duration_seconds_count", model="minilm",
                        priority=priority)


async def test_the_backend_priority_is_the_gateways_and_a_client_may_only_lower_it(
    gateway: GatewayFactory, backend: BackendProc,
) -> None:
    client = await gateway()
    before = {p: backend_served(backend, p) for p in ("1", "2", "3")}
    # No priority of its own: the interactive number (1), not the backend's default (2).
    resp = await client.post("/v2/models/minilm/infer", json=infer_body(["sched one"]))
    assert resp.status == 200
    # Asking for a lower priority (3) is honoured ...
    resp = await client.post("/v2/models/minilm/infer",
                             json=infer_body(["sched two"], parameters={"priority": 3}))
    assert resp.status == 200
    # ... and a client's fairness key or a higher priority than its own is never passed on.
    resp = await client.post("/v2/models/minilm/infer", json=infer_body(
        ["sched three"], parameters={"priority": 1, "fairness_key": "someone-else"}))
    assert resp.status == 200
    after = {p: backend_served(backend, p) for p in ("1", "2", "3")}
    assert after["1"] - before["1"] == 2
    assert after["3"] - before["3"] == 1
    assert after["2"] == before["2"]


async def test_scheduling_parameters_stay_out_of_the_key(gateway: GatewayFactory) -> None:
    client = await gateway()
    first = await client.post("/v2/models/minilm/infer",
                              json=infer_body(["sched key"], parameters={"priority": 2}))
    assert first.headers["X-Cache"] == "MISS"
    again = await client.post("/v2/models/minilm/infer", json=infer_body(
        ["sched key"], parameters={"priority": 3, "timeout": 900_000_000}))
    assert again.headers["X-Cache"] == "HIT"
    # A client's own ``express`` (the gateway's to send) is dropped: no key of its own either.
    asked = await client.post("/v2/models/minilm/infer", json=infer_body(
        ["sched key"], parameters={"express": True}))
    assert asked.headers["X-Cache"] == "HIT"


async def test_a_bad_scheduling_parameter_is_422(gateway: GatewayFactory) -> None:
    client = await gateway()
    for bad in ({"priority": -1}, {"priority": "high"}, {"timeout": 1.5}):
        resp = await client.post("/v2/models/minilm/infer",
                                 json=infer_body(["x"], parameters=bad))
        assert resp.status == 422, bad
        assert "parameters." in (await resp.json())["error"]["message"]
