"""Singleflight and priority: an identical call in flight is joined only at its priority or a
better one (docs/SCHEDULING.md, "Identical calls in flight").

A Batch API line (backend priority 3) and an interactive request (priority 1) of the same
text: the interactive one must not ride the line's call, which waits at the line's priority
in the gateway's queue and the backend's; a line may ride an interactive call. The fake
backend holds every call on an event: ordering, not timing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.pipeline import Result
from gateway.pipeline.context import RequestContext
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, Priority
from tests.gateway.pipeline.rig import ROUTES, Rig, build, in_backend, watch_joins, write_policy

TEXT = "the same sentence from a batch line and a person"


async def ask(rig: Rig, priority: Priority) -> Result:
    path, body, parse = ROUTES[rig.route]
    ctx = RequestContext(request_id="t", route=path, tenant="public",
                         deadline=time.monotonic() + 5.0, priority=priority)
    return await rig.pipeline.run(ctx, parse(body(TEXT)))


async def test_an_interactive_request_does_not_ride_a_batch_lines_call(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    rig.model.gate = asyncio.Event()
    line = asyncio.create_task(ask(rig, BATCH))
    await in_backend(rig, 1)
    person = asyncio.create_task(ask(rig, INTERACTIVE))
    await in_backend(rig, 2)  # its own call, not a join of the line's
    joined = watch_joins(rig)
    second_line = asyncio.create_task(ask(rig, BATCH))
    await asyncio.wait_for(joined.wait(), 5)  # a later line rides the better call
    rig.model.gate.set()
    results = await asyncio.gather(line, person, second_line)
    assert [r.cache_status for r in results] == ["MISS", "MISS", "COALESCED"]
    assert [p["priority"] for p in rig.model.params] == [3, 1]
    assert rig.model.calls == 2
    await rig.pipeline.drain()
    assert len(rig.pipeline.flights) == 0


async def test_a_batch_line_rides_an_interactive_call(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    rig.model.gate = asyncio.Event()
    joined = watch_joins(rig)
    person = asyncio.create_task(ask(rig, INTERACTIVE))
    await in_backend(rig, 1)
    line = asyncio.create_task(ask(rig, BATCH))
    await asyncio.wait_for(joined.wait(), 5)
    rig.model.gate.set()
    results = await asyncio.gather(person, line)
    assert [r.cache_status for r in results] == ["MISS", "COALESCED"]
    assert [p["priority"] for p in rig.model.params] == [1]
    await rig.pipeline.drain()
    assert len(rig.pipeline.flights) == 0
