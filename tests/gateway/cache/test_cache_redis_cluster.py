"""L2 in cluster mode against a real one-node Redis Cluster (all 16384 slots on one node).

One node is enough to run the cluster client's code paths: slot-aware MGET over keys that hash
to many slots, a pipeline of SETs across slots, and SCAN over every primary for purge.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis

from gateway.cache.entry import Entry
from gateway.cache.keys import derive_key
from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from tests.conftest import free_port, wait_port

pytestmark = pytest.mark.redis


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a valid, free port too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    workdir = tempfile.mkdtemp(prefix="gw-redis-cluster-")
    port = _cluster_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", workdir, "--cluster-enabled", "yes",
         "--cluster-config-file", os.path.join(workdir, "nodes.conf")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 15)
        with redis.Redis(host="127.0.0.1", port=port) as admin:
            admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            deadline = time.monotonic() + 15
            while b"cluster_state:ok" not in admin.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the one-node cluster never reached cluster_state:ok")
                time.sleep(0.05)
        yield f"redis+cluster://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


async def test_cluster_batches_and_purge(cluster_url: str) -> None:
    cache = RedisCache(RedisSettings(url=cluster_url, timeout_s=1.0))
    try:
        keys = [
            derive_key(route="/v1/embeddings", model=f"m{i % 2}", model_version="1",
                       scope=f"tenant-{i % 4}", normalization="n1", canonical=str(i).encode())
            for i in range(40)
        ]
        now = time.time()
        assert await cache.store([(key, Entry(str(i).encode(), now, 60))
                                  for i, key in enumerate(keys)]) == 40
        got, ok = await cache.lookup(keys)
        assert ok and [e.value if e else None for e in got] == [str(i).encode() for i in range(40)]
        assert await cache.purge(scope="tenant-1") == 10
        assert await cache.purge(model="m0") == 20
        assert await cache.purge() == 10
        assert await cache.get_many(keys[:3]) == [None] * 3
    finally:
        await cache.close()
