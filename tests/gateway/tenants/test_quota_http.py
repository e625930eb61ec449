"""Quotas over real HTTP (a gateway on a socket, the real backend, a real Redis): 429s with
Retry-After and the RateLimit headers, cache hits exempt, accounting per tenant, the tenants
file's reload changing limits live, and Redis dying mid-run."""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.http.routes import openapi
from gateway.tenants.directory import key_digest
from tests.conftest import RedisServer
from tests.gateway.conftest import GatewayFactory, metric_value
from tests.openapi_support import errors_of

DOC = openapi.document()

ADMIN = "quota-admin-token"
ACME, BETA = "acme-quota-key-0001", "beta-quota-key-0001"


def tenants_yaml(path: Path, acme_quota: str, *, extra: str = "") -> Path:
    path.write_text(textwrap.dedent(f"""
        tenants:
          acme:
            api_keys_sha256: ["{key_digest(ACME)}"]
            quota: {acme_quota}
          beta:
            api_keys_sha256: ["{key_digest(BETA)}"]
        {extra}
    """).lstrip("\n"), encoding="utf-8")
    return path


def embed(texts: list[str]) -> bytes:
    return orjson.dumps({"model": "minilm", "input": texts})


async def post(client: Any, key: str, texts: list[str]) -> Any:
    return await client.post("/v1/embeddings", data=embed(texts), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})


async def test_limits_answer_429_with_headers_and_cache_hits_are_exempt(
        gateway: GatewayFactory, tmp_path: Path, redis_url: str) -> None:
    path = tenants_yaml(tmp_path / "t.yaml", "{requests_per_s: 0.01, requests_burst: 4, "
                                             "texts_per_s: 0.01, texts_burst: 5}")
    client = await gateway(tenants_file=str(path), redis={"url": redis_url}, admin_token=ADMIN)
    first = await post(client, ACME, ["quota one", "quota two"])
    assert first.status == 200
    assert first.headers["RateLimit-Policy"] == ('"requests";q=4;w=400, '
                                                 '"texts";q=5;w=500')
    assert first.headers["RateLimit"] == '"requests";r=3;t=100, "texts";r=3;t=200'
    hit = await post(client, ACME, ["quota one", "quota two"])  # cached: texts not charged
    assert hit.status == 200 and hit.headers["X-Cache"] == "HIT"
    assert hit.headers["RateLimit"] == '"requests";r=2;t=200, "texts";r=3;t=200'
    over = await post(client, ACME, ["quota three", "quota four", "quota five", "quota six"])
    assert over.status == 429
    body = await over.json()
    assert body["error"]["type"] == "rate_limited" and body["error"]["request_id"]
    assert errors_of(DOC, "/components/schemas/Error", body) == []
    assert "texts per second" in body["error"]["message"]
    assert 100 <= int(over.headers["Retry-After"]) <= 101  # one text refills in 100 s
    assert over.headers["RateLimit"].startswith('"requests";r=1;t=300, "texts";r=3;')
    assert (await post(client, ACME, ["quota three"])).status == 200
    refused = await post(client, ACME, ["quota one"])  # requests burst spent
    assert refused.status == 429 and "requests per second" in (await refused.json())[
        "error"]["message"]
    assert refused.headers["RateLimit"].startswith('"requests";r=0;')
    free = await post(client, BETA, ["quota one"])  # no quota: no headers, never limited
    assert free.status == 200 and "RateLimit" not in free.headers

    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gateway_tenant_requests_total", tenant="acme", outcome="ok") == 3
    assert metric_value(text, "gateway_tenant_requests_total", tenant="acme",
                        outcome="rate_limited") == 2
    assert metric_value(text, "gateway_tenant_rate_limited_total", tenant="acme",
                        limit="texts") == 1
    assert metric_value(text, "gateway_tenant_texts_total", tenant="acme", source="backend") == 3
    assert metric_value(text, "gateway_tenant_texts_total", tenant="acme", source="cache") == 2
    assert metric_value(text, "gateway_tenant_tokens_total", tenant="acme") > 0
    assert metric_value(text, "gateway_tenant_compute_seconds_total", tenant="acme") > 0
    assert metric_value(text, "gateway_tenant_compute_saved_seconds_total", tenant="acme") > 0
    assert metric_value(text, "gateway_quota_checks_total", source="redis") >= 7
    assert metric_value(text, "gateway_quota_checks_total", source="local") == 0

    admin = await client.get("/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.status == 200
    doc = await admin.json()
    assert doc["tenants"]["acme"]["quota"]["texts_burst"] == 5
    assert doc["quotas"] == {"enabled": True, "hit_cost": 0.0, "shared": True,
                             "redis_reachable": True}
    assert doc["usage"]["acme"]["requests"] == {"ok": 3.0, "rate_limited": 2.0}
    assert key_digest(ACME) not in (await admin.text())
    assert errors_of(DOC, "/components/schemas/TenantsResponse", doc) == []
    stats = await (await client.get("/admin/stats",
                                    headers={"Authorization": f"Bearer {ADMIN}"})).json()
    assert stats["tenant_usage"]["acme"]["texts"] == {"backend": 3.0, "cache": 2.0}


async def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_hot_answers_and_every_error_carry_the_ratelimit_headers(
        gateway: GatewayFactory, tmp_path: Path) -> None:
    # The headers are the handler's on an answer and the error middleware's on an error (no
    # response-prepare signal): a hot answer, a 4xx raised after the charge and a 429 all
    # carry them; a tenant without limits gets none on any of them.
    path = tenants_yaml(tmp_path / "t.yaml", "{requests_per_s: 0.01, requests_burst: 6}")
    client = await gateway(tenants_file=str(path))
    for _ in range(3):  # MISS, a full-path HIT, then a hot answer
        last = await post(client, ACME, ["hot quota text"])
        assert last.status == 200
    assert "hot;dur=" in last.headers["Server-Timing"]
    assert last.headers["RateLimit"].startswith('"requests";r=3;')
    bad = await client.post("/v1/embeddings", data=b'{"model": "minilm"}', headers={
        "Authorization": f"Bearer {ACME}", "Content-Type": "application/json"})
    assert bad.status in (400, 422) and bad.headers["RateLimit"].startswith('"requests";r=2;')
    for _ in range(2):
        assert (await post(client, ACME, ["hot quota text"])).status == 200
    refused = await post(client, ACME, ["hot quota text"])
    assert refused.status == 429 and refused.headers["RateLimit"].startswith('"requests";r=0;')
    assert refused.headers["RateLimit-Policy"] == '"requests";q=6;w=600'
    for _ in range(3):
        free = await post(client, BETA, ["hot quota text"])
        assert free.status == 200 and "RateLimit" not in free.headers
    assert "hot;dur=" in free.headers["Server-Timing"]


async def test_a_tenants_file_reload_changes_limits_live(gateway: GatewayFactory,
                                                         tmp_path: Path) -> None:
    path = tenants_yaml(tmp_path / "t.yaml", "{requests_per_s: 0.01, requests_burst: 1}")
    client = await gateway(tenants_file=str(path), admin_token=ADMIN,
                           quotas={"poll_interval_s": 0.05})
    assert (await post(client, ACME, ["reload"])).status == 200
    assert (await post(client, ACME, ["reload"])).status == 429

    async def reloads(result: str) -> float:
        return metric_value(await (await client.get("/metrics")).text(),
                            "gateway_tenants_reloads_total", result=result)

    tenants_yaml(path, "{requests_per_s: 0.01, requests_burst: 50}")  # the file watcher
    await wait_for(lambda: reloads("success"))
    ok = await post(client, ACME, ["reload"])
    assert ok.status == 200 and ok.headers["RateLimit-Policy"] == '"requests";q=50;w=5000'

    path.write_text("tenants: {acme: {api_keys_sha256: [nope]}}\n", encoding="utf-8")
    await wait_for(lambda: reloads("failure"))  # refused whole: the last good file stays
    assert (await post(client, ACME, ["reload"])).status == 200
    auth = {"Authorization": f"Bearer {ADMIN}"}
    bad = await client.post("/admin/tenants/reload", headers=auth)
    assert bad.status == 422
    assert "tenants.acme.api_keys_sha256[0]: not a SHA-256 digest" in str(
        (await bad.json())["error"]["errors"])

    tenants_yaml(path, "{requests_per_s: 1000}", extra="defaults: {weight: 3}")
    done = await client.post("/admin/tenants/reload", headers=auth)  # the admin route
    assert done.status == 200 and (await done.json())["tenants"] == 2
    assert (await post(client, ACME, ["reload"])).headers["RateLimit-Policy"] == \
        '"requests";q=1000;w=1'
    listed = await (await client.get("/admin/tenants", headers=auth)).json()
    assert listed["tenants"]["beta"]["weight"] == 3.0  # the defaults apply live too


async def test_redis_dying_mid_run_falls_back_to_local_limits_without_errors(
        gateway: GatewayFactory, tmp_path: Path, redis_url: str,
        redis_server: RedisServer) -> None:
    path = tenants_yaml(tmp_path / "t.yaml", "{requests_per_s: 0.01, requests_burst: 3}")
    client = await gateway(tenants_file=str(path),
                           redis={"url": redis_url, "timeout_s": 0.2, "open_s": 30.0})
    assert (await post(client, ACME, ["redis dies"])).status == 200  # 2 left in Redis
    redis_server.kill()
    try:
        statuses = [(await post(client, ACME, ["redis dies"])).status for _ in range(6)]
    finally:
        redis_server.start()
    # The local limit is a whole burst of its own; nothing errors, the excess is a 429.
    assert statuses == [200, 200, 200, 429, 429, 429]
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gateway_quota_checks_total", source="local") == 6
