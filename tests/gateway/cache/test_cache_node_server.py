"""The node tier in real gateways: workers share it, a restart finds it warm, purge reaches it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.http import app_state as state
from tests.conftest import REPO, free_port
from tests.gateway.conftest import (
    BackendProc,
    GatewayFactory,
    gateway_env,
    metric_value,
    stop_process,
    wait_ready,
)


def start_gateway(backend: BackendProc, node_dir: Path, *, workers: int,
                  port: int) -> subprocess.Popen[bytes]:
    env = {**gateway_env(), "GATEWAY_CACHE_NODE_PATH": str(node_dir)}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--backend", backend.url,
         "--workers", str(workers)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def embed(url: str, text: str) -> httpx.Response:
    # A new connection each time, so the kernel spreads the requests over the workers.
    return httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": text},
                      headers={"Connection": "close"}, timeout=10)


def node_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return metric_value(text, "gateway_cache_lookups_total", tier="node", result="hit")


def test_a_repeat_is_a_hit_whichever_of_two_workers_answers(
        backend: BackendProc, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_gateway(backend, tmp_path / "node", workers=2, port=port)
    try:
        wait_ready(proc, f"{url}/readyz", timeout_s=60, what="gateway")
        first = embed(url, "shared by the workers")
        assert first.status_code == 200 and first.headers["X-Cache"] == "MISS"
        statuses = []
        # Until the worker that did not fill it has answered from the node tier (bounded; each
        # worker hands its counts to /metrics about once a second, hence the pause).
        for _ in range(100):
            reply = embed(url, "shared by the workers")
            statuses.append(reply.headers.get("X-Cache"))
            assert reply.json()["data"] == first.json()["data"]
            if node_hits(url) >= 1:
                break
            time.sleep(0.05)
        assert node_hits(url) >= 1, "the other worker never answered"
        assert set(statuses) == {"HIT"}
    finally:
        stop_process(proc)
    assert proc.returncode == 0


def test_a_restarted_gateway_answers_its_first_repeat_as_a_hit(
        backend: BackendProc, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    text = f"warm across restarts {os.getpid()}"
    proc = start_gateway(backend, tmp_path / "node", workers=1, port=port)
    try:
        wait_ready(proc, f"{url}/readyz", timeout_s=60, what="gateway")
        first = embed(url, text)
        assert first.headers["X-Cache"] == "MISS"
    finally:
        stop_process(proc)  # SIGTERM: a clean stop waits for the node tier's writes
    assert proc.returncode == 0
    before = backend.requests_total()
    proc = start_gateway(backend, tmp_path / "node", workers=1, port=port)
    try:
        wait_ready(proc, f"{url}/readyz", timeout_s=60, what="gateway")
        again = embed(url, text)
        assert again.headers["X-Cache"] == "HIT"
        assert again.json()["data"] == first.json()["data"]
        assert node_hits(url) == 1
    finally:
        stop_process(proc)
    assert backend.requests_total() == before, "the restarted gateway never asked the backend"


TOKEN = "node-admin-token-0123456789abcdef"


async def post_embed(client: Any, text: str) -> str:
    resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": text})
    assert resp.status == 200, await resp.text()
    return str(resp.headers["X-Cache"])


async def test_admin_purge_reaches_the_node_tier_and_the_dashboard_shows_it(
        gateway: GatewayFactory, tmp_path: Path) -> None:
    """Three gateways on one node directory play three workers of a host."""
    shared = {"cache.node.path": str(tmp_path / "shared-node"), "admin_token": TOKEN}
    first, second, third = [await gateway(**shared) for _ in range(3)]
    assert await post_embed(first, "purge me") == "MISS"
    assert await post_embed(first, "keep me") == "MISS"
    await first.app[state.CACHE].flush()
    assert await post_embed(second, "purge me") == "HIT"  # from the node tier
    resp = await first.post("/admin/purge", json={"model": "minilm"},
                            headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status == 200 and (await resp.json())["purged"] == 2
    assert await post_embed(third, "purge me") == "MISS", "gone from the node tier"
    assert await post_embed(third, "keep me") == "MISS"

    auth = {"Authorization": f"Bearer {TOKEN}"}
    stats = await (await second.get("/dashboard/stats.json", headers=auth)).json()
    assert stats["lookups"]["node"] == {"hit": 1} and stats["hit_ratio"]["by_tier"]["node"] == 1
    await third.app[state.CACHE].flush()
    stats = await (await third.get("/dashboard/stats.json", headers=auth)).json()
    assert stats["lookups"]["node"] == {"miss": 2}
    assert stats["tier_bytes"]["node"] > 0, "the size as the last write left it"
