"""The policy guarantees, each shown against a real Redis and the real backend."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.http import app_state as state
from gateway.tenants.directory import Tenants
from tests.gateway.conftest import BackendProc, GatewayFactory, start_backend, stop_process
from tests.gateway.pipeline.rig import WallClock

POLICY = """
version: test-{n}
defaults:
  ttl: {ttl}
  stale_while_revalidate: {swr}
  stale_if_error: {sie}
  privacy:
    detectors: {{email: no_store, card: reject, secret: redact, phone: no_store}}
rules:
  - name: shared-rank
    match: {{routes: [/v1/rank]}}
    scope: shared
  - name: default
"""


def write_policy(folder: Path, n: int = 1, ttl: str = "1h", swr: str = "0s",
                 sie: str = "0s") -> Path:
    path = folder / "policy.yaml"
    path.write_text(POLICY.format(n=n, ttl=ttl, swr=swr, sie=sie))
    return path


async def redis_keys(url: str) -> list[bytes]:
    client = aioredis.from_url(url)
    try:
        return [k async for k in client.scan_iter(match="gw:v1:*")]  # the cache's keys
    finally:
        await client.aclose()


async def embed(client: Any, texts: Any, **headers: str) -> tuple[int, Any, Any]:
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": texts},
                             headers=headers)
    return resp.status, await resp.json(), resp.headers


async def test_no_store_is_never_written_anywhere(gateway: GatewayFactory, redis_url: str,
                                                  tmp_path: Path) -> None:
    client = await gateway(redis={"url": redis_url},
                           policies={"path": str(write_policy(tmp_path))})
    texts = ["a perfectly clean sentence", "write to jane.doe@example.com please",
             "call me on +44 20 7946 0958"]
    status, body, headers = await embed(client, texts)
    assert status == 200 and len(body["data"]) == 3
    assert headers["X-Cache-Policy"] == "default@" + headers["X-Cache-Policy"].split("@", 1)[1]
    await client.server.app[state.CACHE].flush()
    keys = await redis_keys(redis_url)
    assert len(keys) == 1, "only the clean item may be stored"
    l1 = client.server.app[state.CACHE].l1
    assert l1.stats().entries == 1
    raw = b"".join(keys)
    for secret in (b"jane", b"example.com", b"7946"):
        assert secret not in raw
    # Asked again: the clean item is a hit, the PII items go to the backend again.
    status, _, headers = await embed(client, texts)
    assert headers["X-Cache"] == "MISS"
    _, _, headers = await embed(client, texts[0])
    assert headers["X-Cache"] == "HIT"
    _, _, headers = await embed(client, texts[1])
    assert headers["X-Cache"] == "BYPASS", "only a no_store text: the policy kept it out"
    # Client no-store: nothing written either.
    await embed(client, "client says no-store", **{"Cache-Control": "no-store"})
    await client.server.app[state.CACHE].flush()
    assert len(await redis_keys(redis_url)) == 1


async def test_reject_and_redact(gateway: GatewayFactory, backend: BackendProc,
                                 tmp_path: Path) -> None:
    client = await gateway(policies={"path": str(write_policy(tmp_path))})
    before = backend.requests_total()
    status, body, _ = await embed(client, ["fine", "card 4111 1111 1111 1111 thanks"])
    assert status == 422
    assert body["error"]["type"] == "policy_rejected"
    assert "card" in body["error"]["message"] and "4111" not in body["error"]["message"]
    assert backend.requests_total() == before
    # Redaction happens before the key: two different tokens redact to the same text.
    _, first, h1 = await embed(client, "my key is sk-abcdefghijklmnopqrstuvwxyz123456")
    _, second, h2 = await embed(client, "my key is sk-zyxwvutsrqponmlkjihgfedcba654321")
    assert h1["X-Cache"] == "MISS" and h2["X-Cache"] == "HIT"
    assert first["data"] == second["data"]


async def test_tenants_never_share_unless_a_rule_says_shared(
        gateway: GatewayFactory, backend: BackendProc, redis_url: str, tmp_path: Path) -> None:
    keys = {name: f"key-{name}-{i}" for i, name in enumerate(["acme", "globex", "initech"])}
    tenants = Tenants.from_mapping(
        {name: [hashlib.sha256(k.encode()).hexdigest()] for name, k in keys.items()})
    client = await gateway(redis={"url": redis_url},
                           policies={"path": str(write_policy(tmp_path))}, tenants=tenants)
    status, body, _ = await embed(client, "no key")
    assert status == 401 and body["error"]["type"] == "unauthorized"
    status, _, _ = await embed(client, "bad key", Authorization="Bearer nope")
    assert status == 401
    rng = random.Random(7)
    pool = [f"shared question number {i}" for i in range(6)]
    seen: dict[str, set[str]] = {name: set() for name in keys}
    for _ in range(60):
        tenant = rng.choice(list(keys))
        text = rng.choice(pool)
        status, _, headers = await embed(client, text, Authorization=f"Bearer {keys[tenant]}")
        assert status == 200
        expected = "HIT" if text in seen[tenant] else "MISS"
        assert headers["X-Cache"] == expected, (tenant, text, headers["X-Cache"])
        seen[tenant].add(text)
    # /v1/rank is matched by a `shared` rule: one tenant's entries serve another.
    rank = {"model": "minilm", "query": "q shared", "documents": ["d1 shared", "d2 shared"]}
    r1 = await client.post("/v1/rank", json=rank, headers={"Authorization": "Bearer key-acme-0"})
    r2 = await client.post("/v1/rank", json=rank,
                           headers={"Authorization": "Bearer key-globex-1"})
    assert r1.headers["X-Cache"] == "MISS" and r2.headers["X-Cache"] == "HIT"
    assert r1.headers["X-Cache-Policy"].startswith("shared-rank@")


async def test_bad_policy_reload_leaves_serving_untouched(gateway: GatewayFactory,
                                                          tmp_path: Path) -> None:
    path = write_policy(tmp_path, n=1)
    client = await gateway(policies={"path": str(path), "poll_interval_s": 0.1})
    store = client.server.app[state.POLICIES]
    version = store.active.version
    statuses: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        i = 0
        while not stop.is_set() and i < 400:
            status, _, headers = await embed(client, f"during reload {i % 7}")
            statuses.append(status)
            assert headers["X-Cache-Policy"].endswith("@" + version)
            i += 1

    task = asyncio.create_task(traffic())
    path.write_text("version: broken\nrules:\n  - name: default\n    ttl: forever\n")
    await asyncio.sleep(0.6)  # the watcher polls every 0.1 s and must refuse the file
    stop.set()
    await task
    assert statuses and all(s == 200 for s in statuses)
    assert store.active.version == version
    # A good file is picked up by the watcher without a restart.
    write_policy(tmp_path, n=2)
    for _ in range(50):
        if store.active.version != version:
            break
        await asyncio.sleep(0.05)
    assert store.active.version != version
    _, _, headers = await embed(client, "after the good reload")
    assert headers["X-Cache-Policy"].endswith("@" + store.active.version)


async def test_stale_while_revalidate(gateway: GatewayFactory, backend: BackendProc,
                                      tmp_path: Path) -> None:
    clock = WallClock()
    client = await gateway(policies={"path": str(write_policy(tmp_path, ttl="1s", swr="1m"))},
                           clock=clock)
    _, first, h = await embed(client, "stale while revalidate")
    assert h["X-Cache"] == "MISS"
    clock.advance(1.2)
    before = backend.requests_total()
    _, stale, h = await embed(client, "stale while revalidate")
    assert h["X-Cache"] == "STALE" and int(h["Age"]) >= 1
    assert stale["data"] == first["data"]
    await client.server.app[state.PIPELINE].drain()  # the one background refresh
    assert backend.requests_total() == before + 1
    _, _, h = await embed(client, "stale while revalidate")
    assert h["X-Cache"] == "HIT"


async def test_stale_if_error(gateway: GatewayFactory, models_dir: Path, tmp_path: Path) -> None:
    own = start_backend(models_dir)
    clock = WallClock()
    try:
        client = await gateway(backends=[own.url], policies={"path": str(
            write_policy(tmp_path, ttl="1s", sie="1h"))}, routing={"read_timeout_s": 2.0},
            clock=clock)
        _, first, h = await embed(client, "stale if error")
        assert h["X-Cache"] == "MISS"
    finally:
        stop_process(own.proc)
    clock.advance(1.2)
    status, body, h = await embed(client, "stale if error")
    assert status == 200, body
    assert h["X-Cache"] == "STALE"
    assert body["data"] == first["data"]
    status, body, _ = await embed(client, "never cached, backend gone")
    assert status in (502, 503)
    assert body["error"]["type"] in ("bad_gateway", "overloaded")


CACHED_ROUTES = {
    "/v1/embeddings": lambda t: {"model": "minilm", "input": t},
    "/v1/classify": lambda t: {"model": "minilm", "input": t, "labels": ["news", "sport"]},
    "/v1/rank": lambda t: {"model": "minilm", "query": t, "documents": ["one", "two"]},
    "/v2/models/minilm/infer": lambda t: {"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [t]}]},
}


@pytest.mark.parametrize("path", sorted(CACHED_ROUTES))
async def test_a_policy_turned_no_store_makes_older_entries_unreadable(
        path: str, gateway: GatewayFactory, backend: BackendProc, tmp_path: Path) -> None:
    """Over real HTTP and the real model, on every cached route: an entry written while the
    e-mail detector was off never answers once the policy marks e-mails no_store."""
    policy = tmp_path / "policy.yaml"
    text = f"mail me at jane.doe@example.com ({path})"
    policy.write_text(POLICY.format(n=1, ttl="1h", swr="0s", sie="0s").replace(
        "email: no_store", "email: off"))
    client = await gateway(policies={"path": str(policy)})
    body = CACHED_ROUTES[path](text)
    for expected in ("MISS", "HIT"):
        resp = await client.post(path, json=body)
        assert resp.status == 200, await resp.text()
        assert resp.headers["X-Cache"] == expected
    policy.write_text(POLICY.format(n=2, ttl="1h", swr="0s", sie="0s"))
    await client.server.app[state.POLICIES].reload()
    before = backend.requests_total()
    resp = await client.post(path, json=body)
    # Only the e-mail text is no_store now: BYPASS where it is the request's one item, the
    # request's MISS beside the cached labels (classify) or documents (rank).
    alone = path in ("/v1/embeddings", "/v2/models/minilm/infer")
    assert resp.status == 200 and resp.headers["X-Cache"] == ("BYPASS" if alone else "MISS")
    assert resp.headers["X-Cache-Policy"].split("@")[1].startswith("test-2+")
    assert backend.requests_total() == before + 1


async def test_the_gateway_refuses_a_rule_for_a_model_it_does_not_serve(
        gateway: GatewayFactory, tmp_path: Path) -> None:
    """The policies a gateway loads are checked against the models it serves (and aliases)."""
    policy = write_policy(tmp_path)
    client = await gateway(policies={"path": str(policy)})
    store = client.server.app[state.POLICIES]
    good = store.active.version
    policy.write_text(POLICY.format(n=2, ttl="1h", swr="0s", sie="0s").replace(
        "match: {routes: [/v1/rank]}", "match: {routes: [/v1/rank], models: [minilmm]}"))
    with pytest.raises(Exception, match="minilmm"):
        await store.reload()
    assert store.active.version == good
