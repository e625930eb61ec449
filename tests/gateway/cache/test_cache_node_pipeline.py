"""The policy guarantees hold for the node tier too, on every cached route, through the pipeline.

The in-memory pipeline rig (``tests/gateway/pipeline/rig.py``) with its cache swapped for L1 over
a real node tier in a tmp dir. A second L1 over the same directory plays another worker of the
host: what it can read is what the node tier holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cache.memory import MemoryCache
from gateway.cache.node import NodeCache
from gateway.cache.settings import NodeCacheSettings
from gateway.cache.tiered import TieredCache
from tests.gateway.cache.test_cache_node import Recorder
from tests.gateway.pipeline.rig import ROUTES, Rig, build, write_policy

PII = "write to jane.doe@example.com please"
CLEAN = "a perfectly ordinary sentence"
# Entries one request stores besides the subject text (the route's other, clean texts).
OTHERS = {"embeddings": 0, "classify": 2, "rank": 2, "oip": 0}

routes = pytest.mark.parametrize("route", sorted(ROUTES))


async def rig_with_node(route: str, tmp_path: Path, **policy: str) -> tuple[Rig, NodeCache]:
    rig = await build(route, write_policy(tmp_path, **policy))
    node = NodeCache(NodeCacheSettings(path=str(tmp_path / "node")), observer=Recorder(),
                     clock=rig.clock)
    rig.pipeline.cache = TieredCache(rig.l1, None, node=node)
    return rig, node


def other_worker(rig: Rig, node: NodeCache) -> TieredCache:
    """A worker with an empty L1 that shares the node tier."""
    return TieredCache(MemoryCache(max_entries=1000, max_bytes=10**7, clock=rig.clock), None,
                       node=node)


@routes
async def test_a_miss_in_one_worker_is_a_hit_in_another(route: str, tmp_path: Path) -> None:
    rig, node = await rig_with_node(route, tmp_path)
    first, body = await rig.ask(CLEAN)
    await rig.pipeline.drain()
    rig.pipeline.cache = other_worker(rig, node)
    second, again = await rig.ask(CLEAN)
    assert (first.cache_status, second.cache_status) == ("MISS", "HIT")
    assert body == again and rig.model.calls == 1
    await node.close()


@routes
async def test_no_store_items_never_reach_the_node_tier(route: str, tmp_path: Path) -> None:
    rig, node = await rig_with_node(route, tmp_path)
    await rig.ask(PII)
    await rig.ask(CLEAN, cache_control="no-store")
    await rig.pipeline.drain()
    # oip: one item per request, so a PII text keeps the whole request out.
    assert node.stats().entries == (0 if route == "oip" else OTHERS[route])
    rig.pipeline.cache = other_worker(rig, node)
    result, _ = await rig.ask(PII)
    assert result.cache_status == ("MISS" if OTHERS[route] else "BYPASS")
    result, _ = await rig.ask(CLEAN)
    assert result.cache_status == "MISS"
    await node.close()


@routes
async def test_a_policy_turned_no_store_makes_node_entries_unreadable(
        route: str, tmp_path: Path) -> None:
    rig, node = await rig_with_node(route, tmp_path, email="off")
    await rig.ask(PII)
    await rig.pipeline.drain()
    assert node.stats().entries >= 1, "cached while the detector was off"
    write_policy(tmp_path, n=2, email="no_store")
    await rig.policies.reload()
    rig.pipeline.cache = other_worker(rig, node)
    result, _ = await rig.ask(PII)
    assert result.cache_status == ("MISS" if OTHERS[route] else "BYPASS")
    assert sum(PII in texts for texts in rig.model.texts) == 2
    await node.close()


async def test_node_entries_age_with_the_pipeline_clock(tmp_path: Path) -> None:
    rig, node = await rig_with_node("embeddings", tmp_path, ttl="10s", swr="1m")
    _, fresh = await rig.ask(CLEAN)
    await rig.pipeline.drain()
    rig.clock.advance(11)
    rig.pipeline.cache = other_worker(rig, node)
    result, body = await rig.ask(CLEAN)
    assert result.cache_status == "STALE" and body == fresh
    await rig.pipeline.drain()
    rig.clock.advance(3600)
    rig.pipeline.cache = other_worker(rig, node)
    result, _ = await rig.ask(CLEAN)
    assert result.cache_status == "MISS"
    await node.close()
