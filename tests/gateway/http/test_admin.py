"""The admin API against a real backend and a real Redis: purge, policy reload, auth, logging."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http import app_state as state
from gateway.http.routes.ops import register
from gateway.settings import load_settings
from gateway.tenants.directory import Tenants, key_digest
from tests.conftest import free_port
from tests.gateway.conftest import BackendProc

TOKEN = "admin-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADMIN_ROUTES = (("GET", "/admin/stats"), ("POST", "/admin/purge"),
                ("GET", "/admin/policies"), ("POST", "/admin/policies/reload"))
POLICY = """\
version: {version}
rules:
  - name: embeddings
    match: {{routes: ["/v1/embeddings"]}}
    ttl: 1h
  - name: everything-else
    ttl: 10m
"""


async def ops_client(aiohttp_client: Any, backend: BackendProc, *, tenants: Tenants | None = None,
                     **overrides: Any) -> TestClient[Any, Any]:
    """A gateway on a real socket with the ops routes registered (until create_app does it)."""
    values: dict[str, Any] = {"backends": [backend.url], "routing.health_interval_s": 0.5,
                              "admin_token": TOKEN, "policies.poll_interval_s": 3600.0}
    values.update(overrides)
    app = create_app(load_settings(None, values, environ={}), registry=CollectorRegistry(),
                     tenants=tenants)
    if not any(r.canonical == "/dashboard" for r in app.router.resources()):
        register(app)
    client: TestClient[Any, Any] = await aiohttp_client(TestServer(app))
    return client


async def embed(client: TestClient[Any, Any], text: str) -> str:
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": text})
    assert resp.status == 200, await resp.text()
    return str(resp.headers["X-Cache"])


async def redis_keys(url: str) -> set[str]:
    client = aioredis.from_url(url)
    try:
        return {k.decode() async for k in client.scan_iter(match="gw:v1:*")}
    finally:
        await client.aclose()


async def purge(client: TestClient[Any, Any], body: object) -> tuple[int, Any]:
    resp = await client.post("/admin/purge", json=body, headers=AUTH)
    return resp.status, await resp.json()


async def settle(client: TestClient[Any, Any]) -> None:
    """Wait for the background L2 writes of the requests so far."""
    await client.app[state.CACHE].flush()


# -- auth -----------------------------------------------------------------------------------------


async def test_admin_routes_are_404_without_an_admin_token(
    aiohttp_client: Any, backend: BackendProc
) -> None:
    client = await ops_client(aiohttp_client, backend, admin_token=None)
    for method, path in ADMIN_ROUTES:
        resp = await client.request(method, path, headers=AUTH)
        assert resp.status == 404, path
        assert (await resp.json())["error"]["type"] == "not_found"


async def test_admin_needs_the_token(
    aiohttp_client: Any, backend: BackendProc, caplog: pytest.LogCaptureFixture
) -> None:
    client = await ops_client(aiohttp_client, backend)
    wrong = "not-the-token-but-a-secret-anyway"
    caplog.set_level(logging.INFO, logger="gateway.admin")
    for method, path in ADMIN_ROUTES:
        for headers in ({}, {"Authorization": f"Bearer {wrong}"},
                        {"Authorization": f"Basic {TOKEN}"}):
            resp = await client.request(method, path, headers=headers)
            assert resp.status == 401, (path, headers)
            body = await resp.json()
            assert body["error"]["type"] == "unauthorized" and body["error"]["request_id"]
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        # The admin API takes the token from the header only (query strings end up in logs).
        resp = await client.request(method, f"{path}?token={TOKEN}")
        assert resp.status == 401
    refused = [r for r in caplog.records if r.name == "gateway.admin"]
    assert len(refused) == 4 * 4 and all(r.__dict__["status"] == 401 for r in refused)
    assert wrong not in caplog.text and TOKEN not in caplog.text


async def test_every_admin_call_is_logged_with_who_and_what(
    aiohttp_client: Any, backend: BackendProc, caplog: pytest.LogCaptureFixture
) -> None:
    import hashlib

    client = await ops_client(aiohttp_client, backend)
    caplog.set_level(logging.INFO, logger="gateway.admin")
    assert (await client.get("/admin/stats", headers=AUTH)).status == 200
    status, body = await purge(client, {"model": "minilm"})
    assert status == 200 and body == {"purged": 0}
    records = [r for r in caplog.records if r.name == "gateway.admin"]
    assert [(r.__dict__["admin_route"], r.__dict__["status"]) for r in records] == [
        ("/admin/stats", 200), ("/admin/purge", 200)]
    fp = hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    for r in records:
        assert r.__dict__["token_fp"] == fp and r.__dict__["remote"] == "127.0.0.1"
    assert records[1].__dict__["params"] == {"model": "minilm", "purged": 0}
    assert TOKEN not in caplog.text


# -- stats ----------------------------------------------------------------------------------------


async def test_admin_stats(aiohttp_client: Any, backend: BackendProc) -> None:
    client = await ops_client(aiohttp_client, backend)
    await embed(client, "admin stats")
    await embed(client, "admin stats")
    resp = await client.get("/admin/stats", headers=AUTH)
    assert resp.status == 200
    snap = await resp.json()
    assert snap["requests"]["by_cache"] == {"MISS": 1, "HIT": 1}
    assert snap["hit_ratio"]["overall"] == pytest.approx(0.5)
    assert snap["policy"]["version"] == client.app[state.POLICIES].active.version
    assert snap["time"] > 0


# -- purge (L1 and L2) ----------------------------------------------------------------------------


@pytest.mark.redis
async def test_purge_by_model_empties_both_tiers(
    aiohttp_client: Any, backend: BackendProc, redis_url: str
) -> None:
    client = await ops_client(aiohttp_client, backend, redis={"url": redis_url})
    assert await embed(client, "purge model one") == "MISS"
    assert await embed(client, "purge model two") == "MISS"
    await settle(client)
    assert len(await redis_keys(redis_url)) == 2
    assert await embed(client, "purge model one") == "HIT"
    status, body = await purge(client, {"model": "all-MiniLM-L6-v2"})  # an alias works too
    assert status == 200 and body == {"purged": 2}
    assert await redis_keys(redis_url) == set()
    assert await embed(client, "purge model one") == "MISS"  # gone from L1 as well


@pytest.mark.redis
async def test_purge_by_tenant_only_touches_that_tenant(
    aiohttp_client: Any, backend: BackendProc, redis_url: str
) -> None:
    # Without a tenants file every request is tenant "public".
    client = await ops_client(aiohttp_client, backend, redis={"url": redis_url})
    assert await embed(client, "purge tenant") == "MISS"
    await settle(client)
    status, body = await purge(client, {"tenant": "someone-else"})
    assert status == 200 and body == {"purged": 0}
    status, body = await purge(client, {"shared": True, "model": "minilm"})
    assert status == 200 and body == {"purged": 0}
    assert await embed(client, "purge tenant") == "HIT"
    status, body = await purge(client, {"tenant": "public"})
    assert status == 200 and body == {"purged": 1}
    assert await redis_keys(redis_url) == set()
    assert await embed(client, "purge tenant") == "MISS"


@pytest.mark.redis
async def test_purge_by_tenant_leaves_other_tenants_alone(
    aiohttp_client: Any, backend: BackendProc, redis_url: str
) -> None:
    keys = {"acme": "key-of-acme", "globex": "key-of-globex"}
    tenants = Tenants(keys=tuple((key_digest(k), t) for t, k in keys.items()), configured=True)
    client = await ops_client(aiohttp_client, backend, redis={"url": redis_url},
                              tenants=tenants)

    async def as_tenant(tenant: str) -> str:
        resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": "same"},
                                 headers={"Authorization": f"Bearer {keys[tenant]}"})
        assert resp.status == 200, await resp.text()
        return str(resp.headers["X-Cache"])

    assert [await as_tenant("acme"), await as_tenant("globex")] == ["MISS", "MISS"]
    await settle(client)
    assert len(await redis_keys(redis_url)) == 2
    status, body = await purge(client, {"tenant": "acme", "model": "minilm"})
    assert status == 200 and body == {"purged": 1}
    assert len(await redis_keys(redis_url)) == 1
    assert [await as_tenant("acme"), await as_tenant("globex")] == ["MISS", "HIT"]


@pytest.mark.redis
async def test_purge_one_key(aiohttp_client: Any, backend: BackendProc, redis_url: str) -> None:
    client = await ops_client(aiohttp_client, backend, redis={"url": redis_url})
    await embed(client, "purge key keep")
    await settle(client)
    keep = await redis_keys(redis_url)
    await embed(client, "purge key drop")
    await settle(client)
    [drop] = await redis_keys(redis_url) - keep
    digest = drop.rsplit(":", 1)[1]
    status, body = await purge(client, {"key": digest.upper(), "model": "minilm",
                                        "tenant": "public"})
    assert status == 200 and body == {"purged": 1}
    assert await redis_keys(redis_url) == keep
    assert await embed(client, "purge key drop") == "MISS"
    assert await embed(client, "purge key keep") == "HIT"


async def test_purge_rejects_bad_bodies(aiohttp_client: Any, backend: BackendProc) -> None:
    client = await ops_client(aiohttp_client, backend)
    cases: list[tuple[object, str]] = [
        ({}, "body"),
        ({"tenant": "a", "shared": True}, "shared"),
        ({"key": "abc", "model": "minilm", "tenant": "a"}, "key"),
        ({"key": "0" * 32, "tenant": "a"}, "key"),
        ({"key": "0" * 32, "model": "minilm"}, "key"),
        ({"model": "nope"}, "model"),
        ({"model": 3}, "model"),
        ({"shared": "yes"}, "shared"),
        ({"tenants": "a"}, "tenants"),
        (["minilm"], "body"),
    ]
    for body, field in cases:
        status, answer = await purge(client, body)
        assert status == 422, body
        assert answer["error"]["message"].startswith(field), (body, answer)
    resp = await client.post("/admin/purge", data=b"{nope", headers=AUTH)
    assert resp.status == 400
    status, body = await purge(client, {"all": True})
    assert status == 200 and body == {"purged": 0}


async def test_purge_with_redis_down_is_503(aiohttp_client: Any, backend: BackendProc) -> None:
    client = await ops_client(aiohttp_client, backend,
                              redis={"url": f"redis://127.0.0.1:{free_port()}/0"})
    status, body = await purge(client, {"model": "minilm"})
    assert status == 503 and body["error"]["type"] == "cache_unavailable"


# -- policies -------------------------------------------------------------------------------------


async def test_policy_reload_and_version(
    aiohttp_client: Any, backend: BackendProc, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(version="one"))
    client = await ops_client(aiohttp_client, backend, policies={"path": str(path)})
    resp = await client.get("/admin/policies", headers=AUTH)
    assert resp.status == 200
    info = await resp.json()
    assert info["version"].startswith("one+")
    assert info["rules"] == ["embeddings", "everything-else"]
    assert info["sources"] == [str(path)]
    assert info["shadow"] is None

    path.write_text(POLICY.format(version="two").replace("ttl: 10m", "ttl: 20m"))
    resp = await client.post("/admin/policies/reload", headers=AUTH)
    assert resp.status == 200
    body = await resp.json()
    assert body["version"].startswith("two+") and body["version"] != info["version"]
    assert client.app[state.POLICIES].active.version == body["version"]


async def test_invalid_policy_reload_is_422_and_serving_continues(
    aiohttp_client: Any, backend: BackendProc, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(version="good"))
    client = await ops_client(aiohttp_client, backend, policies={"path": str(path)})
    good = client.app[state.POLICIES].active.version
    assert await embed(client, "reload serving") == "MISS"
    path.write_text(POLICY.format(version="bad").replace("ttl: 10m", "ttl: [10m]"))

    async def traffic() -> list[str]:
        return [await embed(client, "reload serving") for _ in range(20)]

    serving = asyncio.create_task(traffic())
    resp = await client.post("/admin/policies/reload", headers=AUTH)
    assert await serving == ["HIT"] * 20
    assert resp.status == 422
    body = await resp.json()
    error = body["error"]
    assert error["type"] == "policy_invalid" and error["request_id"]
    assert error["active_version"] == good
    [issue] = error["errors"]
    assert issue["file"] == str(path) and issue["line"] == 7 and "ttl" in issue["field"]
    assert client.app[state.POLICIES].active.version == good
    info = await (await client.get("/admin/policies", headers=AUTH)).json()
    assert info["version"] == good
