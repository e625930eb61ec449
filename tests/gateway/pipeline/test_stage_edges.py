"""Edges of the pipeline's stages that the full mutation run found unguarded: an error a
follower shares with its leader, the fallback's own failure and status, the current TTL at
lookup, a no-cache request that leaves the cache unread, the active policy matching on the
request's route, model and headers, and the words of the internal-error guards.

All through the in-memory rig (no sockets): ordering by events, never by timing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.texts import parse_embeddings
from gateway.errors import BadGateway, DeadlineExceeded, GatewayError
from gateway.pipeline import MISS, FetchResult, Result
from gateway.pipeline import core as pipeline_core
from gateway.pipeline.context import RequestContext
from gateway.pipeline.vectors import tokens
from gateway.policy.headers import RequestHeaders
from gateway.telemetry.observer import NullObserver
from gateway.upstream.admission.fairqueue import INTERACTIVE
from gateway.upstream.schedule import Schedule
from tests.gateway.pipeline.rig import (
    Rig,
    build,
    in_backend,
    orphaned_follower,
    watch_joins,
    write_policy,
)

TEXT = "a perfectly ordinary sentence"


async def test_a_follower_answers_with_its_leaders_backend_error(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    rig.model.fail = 500
    rig.model.gate = asyncio.Event()
    joined = watch_joins(rig)
    leader = asyncio.create_task(rig.ask(TEXT))
    await in_backend(rig, 1)
    follower = asyncio.create_task(rig.ask(TEXT))
    await asyncio.wait_for(joined.wait(), 5)
    rig.model.gate.set()
    first, second = await asyncio.gather(leader, follower, return_exceptions=True)
    assert rig.model.calls == 1, "the follower shared the leader's call"
    assert isinstance(first, BadGateway) and isinstance(second, BadGateway), (first, second)
    assert str(second) == str(first) and "500" in str(first)


async def test_the_fallbacks_own_failure_is_the_backends_error(tmp_path: Path) -> None:
    """The leader is cancelled; the follower fetches the text itself and the backend fails it:
    the client reads the backend's error, not an internal one."""
    rig = await build("embeddings", write_policy(tmp_path))
    follower = await orphaned_follower(rig, TEXT)
    assert rig.model.gate is not None
    rig.model.fail = 500
    rig.model.gate.set()
    with pytest.raises(BadGateway, match="500"):
        await asyncio.wait_for(follower, 5)
    assert rig.model.calls == 2, "the follower asked the backend itself"


async def test_the_fallbacks_answer_is_a_miss(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    follower = await orphaned_follower(rig, TEXT)
    assert rig.model.gate is not None
    rig.model.gate.set()
    result, _body = await asyncio.wait_for(follower, 5)
    assert [o.status for o in result.outcomes] == [MISS] and result.cache_status == MISS


class Lookups(NullObserver):
    """Counts cache lookups by tier and result."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], int] = {}

    def cache_lookups(self, tier: str, result: str, count: int) -> None:
        if count:
            self.seen[tier, result] = self.seen.get((tier, result), 0) + count


def count_lookups(rig: Rig) -> Lookups:
    lookups = Lookups()
    rig.pipeline.cache._observer = lookups
    return lookups


async def test_an_entry_older_than_the_current_ttl_is_a_stale_lookup(tmp_path: Path) -> None:
    """Stored under a 1 h TTL, read after the policy shortened it to 5 s: the tier reports a
    stale entry (and asks lower tiers for a newer copy), not a hit."""
    policy = write_policy(tmp_path)
    rig = await build("embeddings", policy)
    await rig.ask(TEXT)
    write_policy(tmp_path, n=2, ttl="5s")
    await rig.pipeline.policies.reload()
    rig.clock.advance(10)
    lookups = count_lookups(rig)
    result, _ = await rig.ask(TEXT)
    assert result.cache_status == MISS and rig.model.calls == 2
    assert lookups.seen.get(("l1", "stale")) == 1 and ("l1", "hit") not in lookups.seen


@pytest.mark.parametrize(("sie", "reads"), [("0s", False), ("1h", True)])
async def test_no_cache_reads_the_cache_only_to_keep_stale_if_error_entries(
        tmp_path: Path, sie: str, reads: bool) -> None:
    rig = await build("embeddings", write_policy(tmp_path, sie=sie))
    await rig.ask(TEXT)
    lookups = count_lookups(rig)
    result, _ = await rig.ask(TEXT, cache_control="no-cache")
    assert result.cache_status == MISS and rig.model.calls == 2
    assert bool(lookups.seen) is reads, lookups.seen


ACTIVE_BY_REQUEST = """
version: by-request-1
rules:
  - name: by-header
    match:
      headers: {x-team: search}
  - name: by-route-and-model
    match:
      routes: [/v1/embeddings]
      models: [minilm]
  - name: default
"""


@pytest.mark.parametrize(("headers", "rule"), [({"x-team": "search"}, "by-header"),
                                               ({}, "by-route-and-model")])
async def test_the_active_policy_matches_on_the_requests_route_model_and_headers(
        tmp_path: Path, headers: dict[str, str], rule: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(ACTIVE_BY_REQUEST)
    rig = await build("embeddings", policy)
    call = parse_embeddings({"model": "minilm", "input": [TEXT]}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="acme",
                         deadline=time.monotonic() + 5.0,
                         headers=RequestHeaders(headers.items()))
    result = await rig.pipeline.run(ctx, call)
    assert result.decision.rule.name == rule


async def test_the_backend_call_names_the_requests_model(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    await rig.ask(TEXT)
    assert rig.model.urls == ["http://fake:1/v2/models/minilm/infer"]


async def test_a_request_past_its_deadline_is_told_before_any_backend_call(
        tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    with pytest.raises(DeadlineExceeded) as err:
        await rig.ask(TEXT, timeout_s=-1.0)
    assert str(err.value) == "the request's deadline passed before a backend was called"
    assert rig.model.calls == 0


async def test_a_route_answering_the_wrong_number_of_items_is_an_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = await build("embeddings", write_policy(tmp_path))

    async def short_answer(*_args: Any) -> FetchResult:
        return FetchResult(items=[])

    monkeypatch.setattr(pipeline_core, "fetch", short_answer)
    with pytest.raises(GatewayError) as err:
        await rig.ask(TEXT)
    assert str(err.value) == "internal error: a route answered the wrong number of items"
    assert type(err.value) is GatewayError and err.value.status == 500


async def test_an_unanswered_item_is_an_internal_error_not_a_short_answer(
        tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    call = parse_embeddings({"model": "minilm", "input": [TEXT]}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="public",
                         deadline=time.monotonic() + 5.0)
    plan = rig.pipeline.plan(ctx, call, rig.pipeline.decide(ctx, call))
    with pytest.raises(GatewayError) as err:
        rig.pipeline.finish(ctx, call, plan)
    assert str(err.value) == "internal error: unanswered item"


async def test_a_hit_keeps_the_entrys_metadata(tmp_path: Path) -> None:
    """The token counts a miss reported (usage) are stored with the entry: a hit reports
    the same."""
    rig = await build("embeddings", write_policy(tmp_path))
    miss: Result
    miss, miss_body = await rig.ask(TEXT)
    hit, hit_body = await rig.ask(TEXT)
    assert hit.cache_status == "HIT"
    assert [tokens(o) for o in miss.outcomes] == [len(TEXT.split()) + 2]
    assert [o.meta for o in hit.outcomes] == [o.meta for o in miss.outcomes]
    assert hit_body == miss_body


async def test_a_background_refresh_is_scheduled_as_the_request_it_refreshes(
        tmp_path: Path) -> None:
    """A tenant's per-route backend priority applies to the stale-while-revalidate refresh too."""
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", swr="1m"))
    rig.pipeline.upstream.schedule = Schedule(
        tenant_priority=lambda _t: (INTERACTIVE, None, {"/v1/embeddings": 2}))
    await rig.ask(TEXT)
    rig.clock.advance(11)
    stale, _ = await rig.ask(TEXT)
    assert stale.cache_status == "STALE"
    await rig.pipeline.drain()
    assert rig.model.calls == 2
    assert [p["priority"] for p in rig.model.params] == [2, 2]


async def test_a_miss_joining_a_failed_refresh_gets_its_error(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", swr="1m"))
    await rig.ask(TEXT)
    rig.clock.advance(11)
    rig.model.fail = 500
    rig.model.gate = asyncio.Event()
    joined = watch_joins(rig)
    stale, _ = await rig.ask(TEXT)  # answered stale; its refresh waits in the backend
    assert stale.cache_status == "STALE"
    await in_backend(rig, 2)
    miss = asyncio.create_task(rig.ask(TEXT, cache_control="no-cache"))
    await asyncio.wait_for(joined.wait(), 5)
    rig.model.gate.set()
    with pytest.raises(BadGateway, match="500"):
        await asyncio.wait_for(miss, 5)
    assert rig.model.calls == 2, "the miss joined the refresh's call"
    await rig.pipeline.drain()


async def test_keys_carry_the_version_of_the_requests_own_model(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    versions = {"minilm": "2"}
    rig.pipeline.model_version = versions.get
    first, _ = await rig.ask(TEXT)
    again, _ = await rig.ask(TEXT)
    versions["minilm"] = "3"  # the model was redeployed: its old answers no longer apply
    after, _ = await rig.ask(TEXT)
    assert [first.cache_status, again.cache_status, after.cache_status] == [MISS, "HIT", MISS]


async def test_a_followers_failed_flight_does_not_leave_its_other_flights_unread(
        tmp_path: Path) -> None:
    """A request of two texts follows two flights: the first fails (its stale-if-error entry
    answers), the second succeeds (its answer is used, not thrown away with the first)."""
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", sie="1h"))
    await rig.ask("x")
    rig.clock.advance(11)  # x: past its TTL, inside stale-if-error
    rig.model.fail_texts = {"x"}
    rig.model.gate = asyncio.Event()
    joined = watch_joins(rig)
    first = asyncio.create_task(rig.ask("x"))
    await in_backend(rig, 2)
    second = asyncio.create_task(rig.ask("y"))
    await in_backend(rig, 3)
    call = parse_embeddings({"model": "minilm", "input": ["x", "y"]}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="public",
                         deadline=time.monotonic() + 5.0)
    both = asyncio.create_task(rig.pipeline.run(ctx, call))
    await asyncio.wait_for(joined.wait(), 5)  # it follows x's flight (then y's, in order)
    rig.model.gate.set()
    result = await asyncio.wait_for(both, 5)
    assert [o.status for o in result.outcomes] == ["STALE", "COALESCED"]
    assert rig.model.calls == 3, "the two-text request asked nothing itself"
    await asyncio.gather(first, second)
