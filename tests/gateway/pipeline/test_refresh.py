"""The stale-while-revalidate refresh: it runs as the request that found the entry stale (same
tenant and request id), settles its flight whatever happens, and hands its answer to the misses
that joined it. Written to kill the mutants ``make mutate`` found surviving in
``Pipeline._refresh``; entries are aged with the injected clock, a refresh is held in flight
with the in-memory backend's gate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.pipeline.rig import ROUTES, Rig, build, write_policy

CLEAN = "a perfectly ordinary sentence"

routes = pytest.mark.parametrize("route", sorted(ROUTES))


def record_calls(rig: Rig) -> list[dict[str, Any]]:
    """The keyword arguments of every backend call the pipeline makes."""
    calls: list[dict[str, Any]] = []
    upstream = rig.pipeline.upstream
    for name in ("infer_texts", "infer_raw"):
        method = getattr(upstream, name)

        async def recording(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return await _method(*args, **kwargs)

        setattr(upstream, name, recording)
    return calls


async def stale(route: str, tmp_path: Path) -> Rig:
    rig = await build(route, write_policy(tmp_path, ttl="10s", swr="1m"))
    first, _ = await rig.ask(CLEAN, tenant="acme")
    assert first.cache_status == "MISS"
    rig.clock.advance(11)
    return rig


@routes
async def test_the_refresh_runs_as_the_tenant_and_request(route: str, tmp_path: Path) -> None:
    rig = await stale(route, tmp_path)
    calls = record_calls(rig)
    result, _ = await rig.ask(CLEAN, tenant="acme")
    assert result.cache_status == "STALE"
    await rig.pipeline.drain()
    assert [(c["tenant"], c["request_id"]) for c in calls] == [("acme", "t")]
    mine, _ = await rig.ask(CLEAN, tenant="acme")
    theirs, _ = await rig.ask(CLEAN, tenant="beta")
    assert (mine.cache_status, mine.age_s, theirs.cache_status) == ("HIT", 0, "MISS")


@routes
async def test_a_failed_refresh_releases_its_flight(route: str, tmp_path: Path) -> None:
    rig = await stale(route, tmp_path)
    rig.model.fail = 503
    result, _ = await rig.ask(CLEAN, tenant="acme")
    assert result.cache_status == "STALE"
    await rig.pipeline.drain()
    assert len(rig.pipeline.flights) == 0
    rig.model.fail = None
    again, _ = await asyncio.wait_for(rig.ask(CLEAN, tenant="acme", cache_control="no-cache"), 5)
    assert again.cache_status == "MISS"


@routes
async def test_a_miss_joining_a_refresh_gets_the_refreshed_answer(
        route: str, tmp_path: Path) -> None:
    rig = await stale(route, tmp_path)
    gate = asyncio.Event()
    rig.model.gate = gate
    calls_before = rig.model.calls
    result, body = await rig.ask(CLEAN, tenant="acme")  # STALE, and the refresh is in flight
    assert result.cache_status == "STALE"
    joined = asyncio.create_task(rig.ask(CLEAN, tenant="acme", cache_control="no-cache"))
    for _ in range(10):
        await asyncio.sleep(0)
    gate.set()
    again, again_body = await asyncio.wait_for(joined, 5)
    await rig.pipeline.drain()
    assert again.cache_status == "COALESCED"
    assert again_body == body
    assert rig.model.calls == calls_before + 1, "the miss shared the refresh's call"
