"""Fair share over real HTTP: a gateway on a socket in front of a slow fake backend with one
slot (tests/gateway/routing/oip_fake.py), one tier slot and a queue of four. Tenant A keeps the
queue full; tenant B's requests are still all served, because a full queue sheds the tenant
furthest over its share (A) instead of the newcomer. With the old FIFO queue B's requests were
shed like everyone else's.

What it stands for: the gateway's own queue (admission, fair by tenant) deciding who is shed
when the backend is saturated, end to end over HTTP with quotas and tenants from a real app.
A fake backend because the test needs a backend with exactly one slot and a fixed service
time, so that the queue is full on cue and the counts are exact.
What it cannot show: how the real model behaves under that load (batching lets it take several
requests per slot, its service time varies with batch size and text length), nor fairness
inside the backend's own queue; the real-model scheduling tests cover those."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http import app_state as state
from gateway.settings import load_settings
from gateway.tenants.directory import Tenants, key_digest
from tests.gateway.routing.oip_fake import FakeBackend

A_KEY, B_KEY = "fair-share-key-a-0001", "fair-share-key-b-0001"
FLOODERS = 8


async def test_a_flooding_tenant_does_not_shed_a_quiet_one(
        aiohttp_client: Any, fakes: Callable[..., Awaitable[FakeBackend]]) -> None:
    backend = await fakes(start=False)
    backend.slots = 1  # a capacity: one call at a time (set before start)
    backend.delay_s = 0.05
    await backend.start()
    settings = load_settings(None, {
        "backends": [backend.url], "admission.tier_concurrency": 1, "admission.tier_queue": 4,
        "cache.node.enabled": False, "routing.health_interval_s": 0.5,
        "routing.retry": False}, environ={})
    tenants = Tenants.from_mapping({"a": [key_digest(A_KEY)], "b": [key_digest(B_KEY)]})
    app = create_app(settings, registry=CollectorRegistry(), tenants=tenants)
    client = await aiohttp_client(TestServer(app))
    admission = app[state.ADMISSION]
    tier = app[state.ROUTER].tiers()[0][0]  # the one backend's tier
    seq = iter(range(100_000))

    async def ask(key: str) -> int:
        r = await client.post("/v1/embeddings", data=orjson.dumps(
            {"model": "minilm", "input": [f"fair {key[-6:]} {next(seq)}"]}), headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json",
            "Cache-Control": "no-store"})
        await r.read()
        status: int = r.status
        return status

    a_statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def flood() -> None:
        for _ in range(2000):  # bounded in count; the test stops it far sooner
            if stop.is_set():
                return
            a_statuses[await ask(A_KEY)] += 1

    flooders = [asyncio.create_task(flood()) for _ in range(FLOODERS)]
    try:
        for _ in range(1000):  # until A has filled the queue (10 s at most)
            if admission.queue_depth(tier) >= 4:
                break
            await asyncio.sleep(0.01)
        assert admission.queue_depth(tier) == 4, "tenant A never filled the queue"
        b_statuses = [await ask(B_KEY) for _ in range(5)]
    finally:
        stop.set()
        await asyncio.gather(*flooders)
    assert b_statuses == [200] * 5
    assert a_statuses[200] > 0 and a_statuses[503] > 0  # A got the rest, and was shed
    metrics = await (await client.get("/metrics")).text()
    fair = [line for line in metrics.splitlines()
            if line.startswith('gateway_shed_total{reason="fair_share"}')]
    assert fair and float(fair[0].split()[-1]) >= 1  # B's arrivals shed A's waiters
    assert admission.inflight(tier) == 0 and admission.queue_depth(tier) == 0
