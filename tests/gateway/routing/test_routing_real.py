"""Routing with real backends on loopback in two zones: failover and return, zero failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import BackendProc, GatewayFactory, start_backend, stop_process


@pytest.fixture
def two_zones(models_dir: Path) -> Iterator[list[BackendProc]]:
    near = start_backend(models_dir, zone="zone-a", region="r1")
    far = start_backend(models_dir, zone="zone-b", region="r1")
    procs = [near, far]
    try:
        yield procs
    finally:
        for p in procs:
            stop_process(p.proc)


async def test_near_backend_killed_mid_stream(gateway: GatewayFactory, models_dir: Path,
                                              two_zones: list[BackendProc]) -> None:
    near, far = two_zones
    client = await gateway(backends=[f"{near.url}@r1/zone-a", f"{far.url}@r1/zone-b"],
                           routing={"region": "r1", "zone": "zone-a",
                                    "health_interval_s": 0.2})
    no_store = {"Cache-Control": "no-store"}
    failures: list[int] = []

    async def one(i: int) -> None:
        resp = await client.post("/v1/embeddings", headers=no_store,
                                 json={"model": "minilm", "input": f"stream item {i}"})
        if resp.status != 200:
            failures.append(resp.status)

    for i in range(20):
        await one(i)
    assert far.requests_total() == 0, "the far zone must not be used while the near one is up"
    near_before = near.requests_total()
    assert near_before >= 20

    near.proc.kill()  # mid-stream, no goodbye
    near.proc.wait()
    far_seen_after = None  # requests sent since the kill when the far zone first answered
    for i in range(20, 80):
        await one(i)
        if far_seen_after is None and far.requests_total() > 0:
            far_seen_after = i - 19
    assert failures == [], f"requests failed during failover: {failures}"
    # Counted in requests, not seconds: the first request that meets the dead backend is
    # retried on the far zone (a connection failure), so failover takes one request.
    assert far_seen_after is not None and far_seen_after <= 3  # 1 when measured

    # The near backend comes back on the same port: traffic returns to it.
    restarted = start_backend(models_dir, zone="zone-a", region="r1", port=near.port)
    two_zones.append(restarted)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and restarted.requests_total() == 0:
        await one(1000 + int(time.monotonic() * 1000) % 100000)
        await asyncio.sleep(0.05)
    assert restarted.requests_total() > 0, "traffic never returned to the near zone"
    far_after = far.requests_total()
    for i in range(10):
        await one(5000 + i)
    assert far.requests_total() == far_after, "the far zone kept traffic after the near returned"
    assert failures == []


