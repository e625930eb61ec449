"""The cache and privacy guarantees, on every cached route, through the one pipeline.

Each test runs for /v1/embeddings, /v1/classify, /v1/rank and /v2/models/{name}/infer against an
in-memory backend; entries are aged with an injected clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.errors import BadGateway, Overloaded
from gateway.pipeline.context import RequestContext
from tests.gateway.pipeline.rig import ROUTES, Rig, build, write_policy

PII = "write to jane.doe@example.com please"
CLEAN = "a perfectly ordinary sentence"
# Entries one request leaves in L1: the subject text plus the route's other (clean) texts.
OTHERS = {"embeddings": 0, "classify": 2, "rank": 2, "oip": 0}
WHOLE_REQUEST = {"oip"}  # one item per request: a PII text keeps the whole request out

routes = pytest.mark.parametrize("route", sorted(ROUTES))


def reached(rig: Rig, text: str) -> int:
    """How many backend calls carried ``text``."""
    return sum(text in texts for texts in rig.model.texts)


@routes
async def test_repeat_is_a_hit_and_the_answer_is_identical(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    first, body1 = await rig.ask(CLEAN)
    second, body2 = await rig.ask(CLEAN)
    assert (first.cache_status, second.cache_status) == ("MISS", "HIT")
    assert body1 == body2
    assert rig.model.calls == 1


@routes
async def test_no_store_items_are_neither_written_nor_read(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    await rig.ask(PII)
    others = 0 if route in WHOLE_REQUEST else OTHERS[route]
    assert len(rig.l1) == others, "nothing derived from the no_store text is in the cache"
    result, _ = await rig.ask(PII)
    # Only the no_store text: BYPASS (the policy kept the request out of the cache); beside
    # cached texts it is the request's MISS.
    assert result.cache_status == ("MISS" if others else "BYPASS")
    statuses = [o.status for o in result.outcomes]
    assert statuses.count("BYPASS") == 1 and statuses.count("HIT") == others
    assert reached(rig, PII) == 2


@routes
async def test_policy_changed_to_no_store_makes_older_entries_unreadable(
        route: str, tmp_path: Path) -> None:
    """The OIP route used to answer HIT here from the entry written under the older policy."""
    policy = write_policy(tmp_path, email="off")
    rig = await build(route, policy)
    first, _ = await rig.ask(PII)
    assert first.cache_status == "MISS"
    hit, _ = await rig.ask(PII)
    assert hit.cache_status == "HIT", "cached while the detector was off"
    write_policy(tmp_path, n=2, email="no_store")
    await rig.policies.reload()
    again, _ = await rig.ask(PII)
    assert again.cache_status == ("MISS" if OTHERS[route] else "BYPASS")
    assert reached(rig, PII) == 2, "the old entry must not answer the no_store item"


@routes
async def test_client_no_store_bypasses_and_writes_nothing(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    result, _ = await rig.ask(CLEAN, cache_control="no-store")
    assert result.cache_status == "BYPASS" and len(rig.l1) == 0
    result, _ = await rig.ask(CLEAN)
    assert result.cache_status == "MISS"


@routes
async def test_no_cache_refreshes_and_max_age_bounds_age(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    await rig.ask(CLEAN)
    result, _ = await rig.ask(CLEAN, cache_control="no-cache")
    assert result.cache_status == "MISS" and reached(rig, CLEAN) == 2
    rig.clock.advance(30)
    result, _ = await rig.ask(CLEAN, cache_control="max-age=60")
    assert result.cache_status == "HIT" and result.age_s == pytest.approx(30)
    result, _ = await rig.ask(CLEAN, cache_control="max-age=10")
    assert result.cache_status == "MISS"


@routes
async def test_stale_while_revalidate_refreshes_once(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path, ttl="10s", swr="1m"))
    _, fresh = await rig.ask(CLEAN)
    rig.clock.advance(11)
    answers = await asyncio.gather(*(rig.ask(CLEAN) for _ in range(3)))
    assert [r.cache_status for r, _ in answers] == ["STALE"] * 3
    assert all(body == fresh for _, body in answers)
    await rig.pipeline.drain()
    assert reached(rig, CLEAN) == 2, "three stale answers, one background refresh"
    result, _ = await rig.ask(CLEAN)
    assert result.cache_status == "HIT" and result.age_s == 0


@routes
@pytest.mark.parametrize("cache_control", [None, "no-cache"])
async def test_stale_if_error_when_the_backend_fails(route: str, cache_control: str | None,
                                                     tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path, ttl="10s", sie="1h"))
    _, fresh = await rig.ask(CLEAN)
    rig.clock.advance(60)
    rig.model.fail = 500
    result, body = await rig.ask(CLEAN, cache_control=cache_control)
    assert result.cache_status == "STALE" and body == fresh
    with pytest.raises(BadGateway):
        await rig.ask("never cached")
    rig.model.fail = 503
    result, _ = await rig.ask(CLEAN)
    assert result.cache_status == "STALE"
    with pytest.raises(Overloaded):
        await rig.ask("never cached either")


@routes
async def test_past_every_window_the_backend_error_shows(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path, ttl="10s", sie="20s"))
    await rig.ask(CLEAN)
    rig.clock.advance(31)
    rig.model.fail = 500
    with pytest.raises(BadGateway):
        await rig.ask(CLEAN)


@routes
async def test_identical_misses_in_flight_share_one_call(route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    answers = await asyncio.gather(*(rig.ask(CLEAN) for _ in range(4)))
    statuses = sorted(r.cache_status for r, _ in answers)
    assert statuses == ["COALESCED"] * 3 + ["MISS"]
    assert len({body for _, body in answers}) == 1
    assert reached(rig, CLEAN) == 1


async def test_a_rank_request_past_the_backends_item_limit_is_split(tmp_path: Path) -> None:
    """1 query + 256 documents: the backend takes 256 texts per call, the answer is whole."""
    rig = await build("rank", write_policy(tmp_path))
    docs = [f"document number {i}" for i in range(256)]
    call = ROUTES["rank"][2]({"model": "minilm", "query": "q", "documents": docs})
    ctx = RequestContext(request_id="t", route="/v1/rank", deadline=time.monotonic() + 5)
    result = await rig.pipeline.run(ctx, call)
    assert len(result.outcomes) == 257
    assert sorted(len(t) for t in rig.model.texts) == [1, 256]
    assert all(len(t) <= 256 for t in rig.model.texts)
