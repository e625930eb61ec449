"""Hot answers (gateway/pipeline/hot_answers.py): a repeat is answered from its ready body only
while everything
that decided it still holds; otherwise the full path answers (and is never wrong)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.http import app_state as state
from gateway.tenants.directory import Tenants, key_digest
from tests.gateway.conftest import BackendProc, GatewayFactory, metric_value
from tests.gateway.pipeline.rig import WallClock

POLICY = """
version: hot-{n}
defaults:
  ttl: 1h
rules:
  - name: beta
    match: {{headers: {{x-feature: beta}}}}
    scope: shared
  - name: default
"""

BODY = {"model": "minilm", "input": "hot path sentence"}


async def post(client: Any, path: str, body: Any, **headers: str) -> tuple[int, Any, Any]:
    resp = await client.post(path, json=body, headers=headers)
    return resp.status, await resp.json(), resp.headers


async def test_repeat_is_answered_hot_and_identical(gateway: GatewayFactory,
                                                    backend: BackendProc) -> None:
    client = await gateway()
    hot = client.server.app[state.HOT]
    _, first, h1 = await post(client, "/v1/embeddings", BODY)
    _, second, h2 = await post(client, "/v1/embeddings", BODY)  # full path HIT: now kept ready
    assert (h1["X-Cache"], h2["X-Cache"]) == ("MISS", "HIT") and len(hot) == 1
    before = backend.requests_total()
    _, third, h3 = await post(client, "/v1/embeddings", BODY)
    assert h3["X-Cache"] == "HIT" and third == second == first
    assert h3["X-Cache-Policy"] == h2["X-Cache-Policy"] and "Age" in h3
    assert h3["X-Request-Id"] != h2["X-Request-Id"] and "total;dur=" in h3["Server-Timing"]
    assert backend.requests_total() == before
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gateway_cache_items_total", result="hit") == 2
    assert metric_value(text, "gateway_policy_decisions_total", rule="default") == 3


async def test_purge_policy_reload_and_expiry_end_it(gateway: GatewayFactory, tmp_path: Path,
                                                     backend: BackendProc) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(n=1))
    clock = WallClock()
    client = await gateway(policies={"path": str(policy)}, clock=clock)
    for _ in range(3):
        await post(client, "/v1/embeddings", BODY)
    cache = client.server.app[state.CACHE]
    await cache.purge(model="minilm")
    before = backend.requests_total()
    _, _, h = await post(client, "/v1/embeddings", BODY)
    assert h["X-Cache"] == "MISS" and backend.requests_total() == before + 1
    await post(client, "/v1/embeddings", BODY)  # HIT through the full path: ready again
    policy.write_text(POLICY.format(n=2))
    await client.server.app[state.POLICIES].reload()
    _, _, h = await post(client, "/v1/embeddings", BODY)
    assert h["X-Cache-Policy"].split("@")[1].startswith("hot-2+"), "decided by the new policy"
    await post(client, "/v1/embeddings", BODY)
    clock.advance(3601)
    _, _, h = await post(client, "/v1/embeddings", BODY)
    assert h["X-Cache"] == "MISS", "an expired entry never answers, hot or not"


async def test_a_hot_answers_age_is_its_oldest_items(gateway: GatewayFactory) -> None:
    clock = WallClock()
    client = await gateway(clock=clock)
    await post(client, "/v1/embeddings", {"model": "minilm", "input": "older hot text"})
    clock.advance(50)
    both = {"model": "minilm", "input": ["older hot text", "newer hot text"]}
    _, _, h = await post(client, "/v1/embeddings", both)  # one HIT (age 50), one MISS
    assert h["X-Cache"] == "MISS"
    _, _, h = await post(client, "/v1/embeddings", both)  # all HIT: kept ready
    assert (h["X-Cache"], h["Age"]) == ("HIT", "50")
    clock.advance(10)
    _, _, h = await post(client, "/v1/embeddings", both)
    assert "hot;dur=" in h["Server-Timing"] and h["Age"] == "60"


async def test_key_covers_tenant_headers_path_and_directives(gateway: GatewayFactory,
                                                              tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(n=1))
    tenants = Tenants.from_mapping({"acme": [key_digest("key-acme-0123456789")],
                                    "globex": [key_digest("key-globex-0123456789")]})
    client = await gateway(policies={"path": str(policy)}, tenants=tenants)
    acme = {"Authorization": "Bearer key-acme-0123456789"}
    globex = {"Authorization": "Bearer key-globex-0123456789"}
    for _ in range(3):
        await post(client, "/v1/embeddings", BODY, **acme)
    _, _, h = await post(client, "/v1/embeddings", BODY, **globex)
    assert h["X-Cache"] == "MISS", "another tenant never gets acme's answer"
    _, _, h = await post(client, "/v1/embeddings", BODY, **acme, **{"x-feature": "beta"})
    assert h["X-Cache"] == "MISS" and h["X-Cache-Policy"].startswith("beta@")
    _, _, h = await post(client, "/v1/embeddings", BODY, **acme,
                         **{"Cache-Control": "no-cache"})
    assert h["X-Cache"] == "MISS", "no-cache always reaches the backend"
    status, _, _ = await post(client, "/v1/embeddings", BODY)
    assert status == 401, "authentication happens before any hot answer"
    oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["v"]}]}
    for _ in range(3):
        status, _, _ = await post(client, "/v2/models/minilm/infer", oip, **acme)
        assert status == 200
    status, body, _ = await post(client, "/v2/models/minilm/versions/999/infer", oip, **acme)
    assert status == 404 and body["error"]["type"] == "model_not_found"


async def test_without_header_rules_the_key_still_covers_tenant_and_path(
        gateway: GatewayFactory) -> None:
    # The default policy matches on no header: the key is one hash of a prefix kept per
    # (path, tenant) and the body. Another tenant, or another route with the same body,
    # never gets the answer.
    tenants = Tenants.from_mapping({"acme": [key_digest("key-acme-0123456789")],
                                    "globex": [key_digest("key-globex-0123456789")]})
    client = await gateway(tenants=tenants)
    acme = {"Authorization": "Bearer key-acme-0123456789"}
    globex = {"Authorization": "Bearer key-globex-0123456789"}
    for _ in range(3):
        _, _, h = await post(client, "/v1/embeddings", BODY, **acme)
    assert "hot;dur=" in h["Server-Timing"]
    _, _, h = await post(client, "/v1/embeddings", BODY, **globex)
    assert "hot;dur=" not in h["Server-Timing"] and h["X-Cache"] == "MISS"
    oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["v"]}]}
    for _ in range(3):
        status, _, h = await post(client, "/v2/models/minilm/infer", oip, **acme)
    assert status == 200 and "hot;dur=" in h["Server-Timing"]
    version = client.server.app[state.ROUTER].model_version("minilm")
    versioned = f"/v2/models/minilm/versions/{version}/infer"  # the same route, another path
    status, _, h = await post(client, versioned, oip, **acme)
    assert status == 200 and "hot;dur=" not in h["Server-Timing"]


async def test_an_entry_l1_dropped_still_answers_hot_from_the_node_tier(
        gateway: GatewayFactory, backend: BackendProc) -> None:
    # Admission off: it would keep BODY (asked three times) in L1 and the newcomer out.
    client = await gateway(cache={"max_entries": 1, "admission": False})
    other = {"model": "minilm", "input": "another hot sentence"}
    for _ in range(3):
        _, first, _ = await post(client, "/v1/embeddings", BODY)
    await client.server.app[state.CACHE].flush()  # the node tier's background write
    await post(client, "/v1/embeddings", other)  # evicts BODY's entry from the 1-entry L1
    before = backend.requests_total()
    hot = client.server.app[state.HOT]
    status, again, h = await post(client, "/v1/embeddings", BODY)
    assert status == 200 and h["X-Cache"] == "HIT" and again == first
    assert backend.requests_total() == before
    assert "hot;dur=" in h["Server-Timing"], "answered hot, with the node tier's entry"
    assert len(hot) >= 1
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gateway_cache_lookups_total", tier="node", result="hit") >= 1


COUNTED = ("gateway_cache_items_total", "gateway_cache_lookups_total",
           "gateway_policy_decisions_total", "gateway_compute_saved_seconds_total",
           "gateway_tenant_requests_total", "gateway_tenant_texts_total",
           "gateway_tenant_tokens_total", "gateway_tenant_compute_saved_seconds_total")


def counted(text: str) -> dict[str, float]:
    """Every sample of the families a hit moves, by its line's name and labels."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(COUNTED)}


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 9) for k, v in after.items()
            if round(v - before.get(k, 0.0), 9)}


async def test_hot_answers_count_exactly_as_full_path_hits(gateway: GatewayFactory) -> None:
    # Hot answers are one record each (gateway/telemetry/prometheus.py ``hot_answered``),
    # fanned out at the flush: N of them move every series a full-path HIT moves, N times,
    # per tenant, and a scrape between them loses or repeats none.
    tenants = Tenants.from_mapping({"acme": [key_digest("key-acme-0123456789")],
                                    "globex": [key_digest("key-globex-0123456789")]})
    client = await gateway(tenants=tenants)
    keys = {"acme": "Bearer key-acme-0123456789", "globex": "Bearer key-globex-0123456789"}
    raw = orjson.dumps(BODY)

    async def send(tenant: str, pad: int = 0) -> str:
        resp = await client.post("/v1/embeddings", data=raw + b" " * pad, headers={
            "Authorization": keys[tenant], "Content-Type": "application/json"})
        assert resp.status == 200
        return resp.headers["Server-Timing"]

    async def scrape() -> dict[str, float]:
        return counted(await (await client.get("/metrics")).text())

    for tenant in keys:
        await send(tenant)  # MISS
        await send(tenant)  # a full-path HIT: kept ready
    one_hit = {}
    for tenant in keys:  # a full-path HIT each (its body was never sent: never hot)
        start = await scrape()
        await send(tenant, pad=1)
        one_hit[tenant] = moved(start, await scrape())
        assert one_hit[tenant]

    def times(n_acme: int, n_globex: int) -> dict[str, float]:
        total = {k: n_acme * v for k, v in one_hit["acme"].items()}
        for k, v in one_hit["globex"].items():
            total[k] = total.get(k, 0.0) + n_globex * v
        return {k: round(v, 9) for k, v in total.items() if v}

    before = await scrape()
    for _ in range(3):
        assert "hot;dur=" in await send("acme")
    middle = await scrape()
    for _ in range(2):
        assert "hot;dur=" in await send("acme")
    assert "hot;dur=" in await send("globex")
    after = await scrape()
    assert moved(before, middle) == times(3, 0)
    assert moved(middle, after) == times(2, 1)
