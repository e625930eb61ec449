"""L2 in a real Redis: shared by gateway processes, and Redis dying never fails a request."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import redis.asyncio as aioredis

from tests.conftest import REPO, RedisServer, free_port
from tests.gateway.conftest import (
    BackendProc,
    GatewayFactory,
    gateway_env,
    stop_process,
    wait_ready,
)


def start_gateway(backend: BackendProc, redis_url: str, *extra: str) -> tuple[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--backend", backend.url, "--redis", redis_url, "--workers", "1", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, env=gateway_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/readyz", timeout_s=60, what="gateway")
    return url, proc


async def test_two_gateway_processes_share_l2(backend: BackendProc, redis_url: str) -> None:
    a_url, a = start_gateway(backend, redis_url)
    b_url, b = start_gateway(backend, redis_url)
    try:
        body = {"model": "minilm", "input": ["shared between replicas", "second item"]}
        rc = aioredis.from_url(redis_url)
        async with httpx.AsyncClient(timeout=10) as http:
            first = await http.post(f"{a_url}/v1/embeddings", json=body)
            assert first.headers["X-Cache"] == "MISS"
            # The store to L2 happens just after the response: wait until it has landed.
            for _ in range(100):
                if len([k async for k in rc.scan_iter(match="gw:v1:*")]) == 2:
                    break
                await asyncio.sleep(0.02)
            await rc.aclose()
            before = backend.requests_total()
            second = await http.post(f"{b_url}/v1/embeddings", json=body)
            assert second.headers["X-Cache"] == "HIT"
            assert second.json()["data"] == first.json()["data"]
            assert backend.requests_total() == before
    finally:
        stop_process(a)
        stop_process(b)
    client = aioredis.from_url(redis_url)
    try:
        keys = [k.decode() async for k in client.scan_iter(match="gw:v1:*")]
    finally:
        await client.aclose()
    assert len(keys) == 2
    for key in keys:  # keys carry model, a scope tag and a hash: never the text
        assert "shared" not in key and "replicas" not in key
        assert key.startswith("gw:v1:minilm:")


async def test_redis_killed_mid_test_keeps_serving(gateway: GatewayFactory,
                                                   redis_server: RedisServer,
                                                   redis_url: str) -> None:
    client = await gateway(redis={"url": redis_url, "timeout_s": 0.05})
    statuses = []
    for i in range(5):
        resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": f"up {i}"})
        statuses.append(resp.status)
    redis_server.kill()
    try:
        for i in range(20):
            resp = await client.post("/v1/embeddings",
                                     json={"model": "minilm", "input": f"redis down {i}"})
            statuses.append(resp.status)
            # L1 still answers what it holds.
        resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": "up 0"})
        assert resp.headers["X-Cache"] == "HIT"
    finally:
        redis_server.start()
    assert statuses == [200] * len(statuses)
    # Recovery is automatic: new entries reach Redis again once the breaker closes.
    rc = aioredis.from_url(redis_url)
    try:
        stored = 0
        for i in range(60):
            resp = await client.post("/v1/embeddings",
                                     json={"model": "minilm", "input": f"after recovery {i}"})
            assert resp.status == 200
            stored = len([k async for k in rc.scan_iter(match="gw:v1:*")])
            if stored:
                break
            await asyncio.sleep(0.25)
        assert stored > 0, "the gateway never wrote to Redis again after it came back"
    finally:
        await rc.aclose()
