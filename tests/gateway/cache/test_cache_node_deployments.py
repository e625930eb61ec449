"""The node tier is scoped by deployment: gateway processes on one host pointed at one node
directory share entries only when configured alike (tenants file, deployment name, the graph
their backends serve), never across deployments."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cache.deployment import Deployment
from gateway.cache.deployment import deployment_of as of
from gateway.cache.node import open_node_cache
from gateway.cache.settings import NodeCacheSettings
from gateway.tenants.directory import Tenants, key_digest
from tests.conftest import REPO, free_port
from tests.gateway.conftest import (
    BackendProc,
    gateway_env,
    metric_value,
    start_backend,
    stop_process,
    wait_ready,
)

KEY_ONE, KEY_TWO = "deployment-one-key-0001", "deployment-two-key-0002"
TEXT = "which deployment answered this?"


@pytest.fixture(scope="module")
def int8_backend(models_dir: Path) -> Iterator[BackendProc]:
    """Other weights under the same model name and version: the int8 graph of minilm."""
    proc = start_backend(models_dir, extra=("--variant", "int8"))
    try:
        yield proc
    finally:
        stop_process(proc.proc)


def tenants_file(path: Path, key: str) -> Path:
    path.write_text(f'tenants:\n  acme:\n    api_keys_sha256: ["{key_digest(key)}"]\n',
                    encoding="utf-8")
    return path


class Gateway:
    """A gateway process (one worker) in front of ``backend`` over a given node directory."""

    def __init__(self, backend: BackendProc, node_dir: Path, tenants: Path, key: str) -> None:
        self.key = key
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**gateway_env(), "GATEWAY_CACHE_NODE_PATH": str(node_dir),
               "GATEWAY_TENANTS_FILE": str(tenants)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--backend",
             backend.url, "--workers", "1"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_ready(self.proc, f"{self.url}/readyz", timeout_s=90, what="gateway")

    def embed(self) -> httpx.Response:
        reply = httpx.post(f"{self.url}/v1/embeddings", json={"model": "minilm", "input": TEXT},
                           headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(httpx.get(f"{self.url}/metrics", timeout=10).text, name, **labels)


def test_only_identically_configured_gateways_share_node_entries(
        backend: BackendProc, int8_backend: BackendProc, tmp_path: Path) -> None:
    node_dir = tmp_path / "shared-node"
    one = tenants_file(tmp_path / "tenants-one.yaml", KEY_ONE)
    two = tenants_file(tmp_path / "tenants-two.yaml", KEY_TWO)  # another key, same tenant name
    gateways: list[Gateway] = []
    try:
        writer = Gateway(backend, node_dir, one, KEY_ONE)
        gateways.append(writer)
        first = writer.embed()
        assert first.headers["X-Cache"] == "MISS"
        deadline = time.monotonic() + 30
        while writer.metric("gateway_cache_stores_total", tier="node") < 1:  # written through
            assert time.monotonic() < deadline, "the entry never reached the node tier"
            time.sleep(0.2)

        other_tenants = Gateway(backend, node_dir, two, KEY_TWO)
        other_model = Gateway(int8_backend, node_dir, one, KEY_ONE)
        twin = Gateway(backend, node_dir, one, KEY_ONE)
        gateways += [other_tenants, other_model, twin]

        for stranger in (other_tenants, other_model):
            reply = stranger.embed()
            assert reply.headers["X-Cache"] == "MISS"
            assert stranger.metric("gateway_cache_lookups_total", tier="node",
                                   result="hit") == 0
        # What sharing would have served: the int8 graph's vector is not the fp32 one.
        assert other_model.embed().json()["data"] != first.json()["data"]

        shared = twin.embed()  # a fresh process: its L1 is empty, so this is the node tier
        assert shared.headers["X-Cache"] == "HIT"
        assert shared.json()["data"] == first.json()["data"]
        assert twin.metric("gateway_cache_lookups_total", tier="node", result="hit") >= 1
    finally:
        for gateway in gateways:
            stop_process(gateway.proc)


def test_the_default_directory_and_namespace_follow_the_deployment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    settings = NodeCacheSettings()
    acme_one = Tenants.from_mapping({"acme": [key_digest(KEY_ONE)]})
    acme_two = Tenants.from_mapping({"acme": [key_digest(KEY_TWO)]})
    def deployment_of(settings: NodeCacheSettings, tenants: Tenants) -> Deployment:
        return of(settings, keys=tenants.keys, configured=tenants.configured)

    first, second = deployment_of(settings, acme_one), deployment_of(settings, acme_two)
    assert first.namespace != second.namespace and first.tag != second.tag
    assert deployment_of(settings, Tenants.from_mapping({"acme": [key_digest(KEY_ONE)]})) \
        == first  # the same file is the same deployment
    named = NodeCacheSettings(deployment="search-prod")
    assert deployment_of(named, acme_one) == deployment_of(named, acme_two)  # named: as said
    assert deployment_of(named, acme_one).tag != first.tag
    for deployment in (first, second):
        node = open_node_cache(settings, deployment=deployment)
        assert node is not None
        assert node.path == str(tmp_path / "edge-gateway" / "node" / deployment.tag)
        asyncio.run(node.close())
    assert sorted(p.name for p in (tmp_path / "edge-gateway" / "node").iterdir()) \
        == sorted([first.tag, second.tag])
