"""Scheduling end to end with the real model: a gateway (in this process, on a socket) in front
of a real ``python -m backend serve`` process. What is asserted is order and counts (who was
answered while how many of the others were still outstanding), never timings.

- With the shipped settings the gateway's in-flight limit follows what the backend can use
  (the adaptive limit), so a flood waits in the gateway's fair queue: a quiet tenant's request
  is answered before the flood's backlog there.
- Where the backlog forms inside the backend anyway (a gateway with a fixed limit of 64, as when
  several gateways share one backend), a tenant flooding the backend does not delay a quiet
  tenant's request behind its whole flood: the backend serves fairness keys (the gateway sends a
  hash of each tenant) in turn.
- Batch-class work (a tenant of class ``batch``: the backend priority Batch API lines get too)
  never gets ahead of interactive calls there: interactive ones are answered while the batch
  backlog still waits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.tenants.directory import Tenants, key_digest
from tests.gateway.conftest import (
    BackendProc,
    GatewayFactory,
    metric_value,
    start_backend,
    stop_process,
)

# A loaded 2-core machine computes a long text in up to 0.5 s instead of 35 ms.
pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

FLOOD_KEY, QUIET_KEY, BULK_KEY = "sched-flood-key-0001", "sched-quiet-key-0001", "sched-bulk-0001"
FLOOD = 16  # concurrent long-text requests: a backlog of half a second or more
_seq = itertools.count()


def long_text() -> str:  # unique (a true miss), about 300 words: cut to 256 tokens
    return f"request {next(_seq)} " + "the quick brown fox jumps over the lazy dog " * 34


def pending(backend: BackendProc, priority: str) -> float:
    text = httpx.get(f"{backend.url}/metrics", timeout=5).text
    return metric_value(text, "backend_pending_requests", model="minilm", priority=priority)


async def ask(client: Any, key: str, text: str) -> int:
    resp = await client.post("/v1/embeddings", data=orjson.dumps(
        {"model": "minilm", "input": [text]}), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json",
        "Cache-Control": "no-store"})
    await resp.read()
    status: int = resp.status
    return status


def sender(client: Any, done: list[str], *, sheddable: str
           ) -> Callable[[str, str], Awaitable[None]]:
    """``send(who, key)``: one long text as ``who``; its answer's arrival appended to ``done``
    (in order). Only ``sheddable``'s requests may be refused (503: the backlog would outlast
    their deadline); a refused request was never in the queue, so it is not recorded."""

    async def send(who: str, key: str) -> None:
        status = await ask(client, key, long_text())
        assert status == 200 or (who == sheddable and status == 503), (who, status)
        if status == 200:
            done.append(who)

    return send


async def until_backlog(backend: BackendProc, priority: str, at_least: float) -> None:
    give_up = asyncio.get_running_loop().time() + 60  # a bound, not an assertion on time
    while asyncio.get_running_loop().time() < give_up:
        if await asyncio.to_thread(pending, backend, priority) >= at_least:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no backlog of {at_least} at priority {priority}")


async def until_gateway_backlog(client: Any, at_least: float) -> None:
    give_up = asyncio.get_running_loop().time() + 60  # a bound, not an assertion on time
    while asyncio.get_running_loop().time() < give_up:
        resp = await client.get("/metrics")
        if metric_value(await resp.text(), "gateway_queue_depth") >= at_least:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no gateway backlog of {at_least}")


FIXED_LIMIT = {"admission.adaptive.enabled": False}
"""The gateway lets 64 calls through (``tier_concurrency``): the backlog forms in the backend."""


async def test_shipped_limit_keeps_a_flood_in_the_gateway_queue_where_a_quiet_tenant_passes_it(
    gateway: GatewayFactory, backend: BackendProc,
) -> None:
    tenants = Tenants.from_mapping({"flood": [key_digest(FLOOD_KEY)],
                                    "quiet": [key_digest(QUIET_KEY)]})
    client = await gateway(tenants=tenants)
    done: list[str] = []

    send = sender(client, done, sheddable="flood")

    flood = [asyncio.create_task(send("flood", FLOOD_KEY)) for _ in range(FLOOD)]
    await until_gateway_backlog(client, FLOOD // 2)
    assert await asyncio.to_thread(pending, backend, "1") < FLOOD // 2  # not in the backend
    await send("quiet", QUIET_KEY)
    flood_before_quiet = done.index("quiet")
    await asyncio.gather(*flood)
    # FIFO would answer the quiet request after every flood request queued before it (at
    # least FLOOD / 2); the gateway's fair queue grants it the next slot.
    assert flood_before_quiet <= FLOOD // 2 - 4, done


async def test_a_flooding_tenant_does_not_delay_a_quiet_one_behind_its_whole_flood(
    gateway: GatewayFactory, backend: BackendProc,
) -> None:
    tenants = Tenants.from_mapping({"flood": [key_digest(FLOOD_KEY)],
                                    "quiet": [key_digest(QUIET_KEY)]})
    client = await gateway(tenants=tenants, **FIXED_LIMIT)
    done: list[str] = []

    send = sender(client, done, sheddable="flood")

    flood = [asyncio.create_task(send("flood", FLOOD_KEY)) for _ in range(FLOOD)]
    await until_backlog(backend, "1", FLOOD // 2)
    await send("quiet", QUIET_KEY)
    flood_before_quiet = done.index("quiet")
    await asyncio.gather(*flood)
    # FIFO would answer the quiet request after every flood request queued before it (at
    # least FLOOD / 2); fairness serves it in the next batch or two.
    assert flood_before_quiet <= FLOOD // 2 - 4, done


async def test_batch_class_work_never_gets_ahead_of_interactive_calls(
    gateway: GatewayFactory, backend: BackendProc, tmp_path: Path,
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        f"  quiet: {{api_keys_sha256: [{key_digest(QUIET_KEY)}]}}\n"
        f"  bulk: {{api_keys_sha256: [{key_digest(BULK_KEY)}], priority: batch}}\n")
    client = await gateway(tenants=Tenants.load(path), **FIXED_LIMIT)
    done: list[str] = []

    send = sender(client, done, sheddable="bulk")

    bulk = [asyncio.create_task(send("bulk", BULK_KEY)) for _ in range(FLOOD)]
    await until_backlog(backend, "3", FLOOD // 2)
    for _ in range(2):  # one after another, each behind whatever batch is computing
        await send("interactive", QUIET_KEY)
    bulk_before_last = len(done) - 2
    await asyncio.gather(*bulk)
    # Every interactive call was answered while at least half the batch backlog still waited.
    assert bulk_before_last <= FLOOD // 2 - 2, done


@pytest.fixture(scope="module")
def express_backend(models_dir: Path) -> Iterator[BackendProc]:
    """A real backend with the express lane and its regular workers niced."""
    proc = start_backend(models_dir, extra=("--express-lane", "--compute-nice", "5"))
    try:
        yield proc
    finally:
        stop_process(proc.proc)


async def test_with_the_express_lane_a_quiet_tenant_is_computed_beside_the_floods_batch(
    gateway: GatewayFactory, express_backend: BackendProc,
) -> None:
    tenants = Tenants.from_mapping({"flood": [key_digest(FLOOD_KEY)],
                                    "quiet": [key_digest(QUIET_KEY)]})
    client = await gateway(tenants=tenants, backends=[express_backend.url],
                           **{"admission.express": True}, **FIXED_LIMIT)
    done: list[str] = []

    send = sender(client, done, sheddable="flood")

    flood = [asyncio.create_task(send("flood", FLOOD_KEY)) for _ in range(FLOOD)]
    await until_backlog(express_backend, "1", FLOOD // 2)
    batches, items = await asyncio.to_thread(express_batches, express_backend)
    await send("quiet", QUIET_KEY)
    # A regular worker was computing the flood's backlog when the quiet text came: the lane
    # took it (one batch, one text), and none of the flood's.
    assert await asyncio.to_thread(express_batches, express_backend) == (batches + 1, items + 1)
    flood_before_quiet = done.index("quiet")
    await asyncio.gather(*flood)
    assert flood_before_quiet <= FLOOD // 2 - 4, done
    assert await asyncio.to_thread(express_batches, express_backend) == (batches + 1, items + 1)


def express_batches(backend: BackendProc) -> tuple[float, float]:
    text = httpx.get(f"{backend.url}/metrics", timeout=5).text
    return (metric_value(text, "backend_express_batches_total", model="minilm"),
            metric_value(text, "backend_express_items_total", model="minilm"))
