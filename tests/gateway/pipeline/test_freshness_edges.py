"""Edges of the cache semantics, item by item: windows at their boundary, lists whose items are
in different states, what a HIT carries, what client no-store forbids even on a backend failure,
and that request text is never logged by default.

Written to kill the mutants ``make mutate`` found surviving in gateway/pipeline/ (core.py,
freshness.py); entries are aged with the injected clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gateway.adapters.texts import parse_embeddings
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.tiered import TieredCache
from gateway.errors import BadGateway, GatewayError
from gateway.pipeline import Result
from gateway.pipeline.accounting import usage_of
from gateway.pipeline.call import Outcome
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.pipeline.freshness import stale_if_error
from gateway.policy.model import Rule
from gateway.policy.store import PolicyStore
from gateway.telemetry.observer import NullObserver
from tests.gateway.pipeline.rig import Rig, build, write_policy


async def embed(rig: Rig, texts: list[str], cache_control: str | None = None) -> Result:
    call = parse_embeddings({"model": "minilm", "input": texts}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="acme",
                         deadline=time.monotonic() + 5.0,
                         directives=CacheDirectives.parse(cache_control))
    return await rig.pipeline.run(ctx, call)


def statuses(result: Result) -> list[str]:
    return [o.status for o in result.outcomes]


async def test_items_after_a_miss_an_old_or_an_expired_entry_still_hit(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s"))
    await embed(rig, ["old"])
    rig.clock.advance(8)
    await embed(rig, ["young"])
    # old is 8 s old, young 0 s: max-age=5 refuses old only; new was never cached.
    assert statuses(await embed(rig, ["new", "old", "young"], "max-age=5")) == [
        "MISS", "MISS", "HIT"]
    rig.clock.advance(11)  # everything stored so far is past its TTL (and no swr)
    await embed(rig, ["late"])
    assert statuses(await embed(rig, ["old", "late"])) == ["MISS", "HIT"]


async def test_max_age_admits_an_entry_exactly_that_old(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    await embed(rig, ["text"])
    rig.clock.advance(5)
    assert statuses(await embed(rig, ["text"], "max-age=5")) == ["HIT"]
    assert statuses(await embed(rig, ["text"], "max-age=4")) == ["MISS"]


async def test_hits_and_stale_answers_carry_their_key_entry_and_age(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", swr="1m"))
    await embed(rig, ["a", "b"])
    rig.clock.advance(4)
    hit = await embed(rig, ["a"])
    rig.clock.advance(7)
    stale = await embed(rig, ["b"])
    await rig.pipeline.drain()
    for result, status, age in ((hit, "HIT", 4.0), (stale, "STALE", 11.0)):
        (o,) = result.outcomes
        assert o.status == status and o.age_s == pytest.approx(age)
        assert isinstance(o.key, CacheKey) and o.key.scope == "acme"
        assert isinstance(o.entry, Entry) and o.entry.value == o.value


async def test_compute_saved_is_the_sum_over_the_answered_entries(tmp_path: Path) -> None:
    saved: list[float] = []

    class Saved(NullObserver):
        def compute_saved(self, model: str, seconds: float) -> None:
            saved.append(seconds)

    rig = await build("embeddings", write_policy(tmp_path))
    rig.pipeline.observer = Saved()
    await embed(rig, ["a", "b"])
    assert saved == []
    await embed(rig, ["a", "b", "c"])
    entries = [rig.l1.get(o.key) for o in (await embed(rig, ["a", "b"])).outcomes]
    per_item = [e.compute_ms / 1000.0 for e in entries if e is not None]
    assert len(per_item) == 2 and all(ms > 0 for ms in per_item)
    assert saved[0] == pytest.approx(sum(per_item))


async def test_client_no_store_never_reads_even_for_stale_if_error(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", sie="1h"))
    await embed(rig, ["a"])
    rig.clock.advance(20)
    rig.model.fail = 502
    with pytest.raises(BadGateway):
        await embed(rig, ["a"], "no-store")
    assert statuses(await embed(rig, ["a"])) == ["STALE"], "the entry was there to serve"


async def test_a_one_second_stale_if_error_window_still_serves(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", sie="1s"))
    await embed(rig, ["a"])
    rig.clock.advance(10.5)
    rig.model.fail = 503
    assert statuses(await embed(rig, ["a"], "no-cache")) == ["STALE"]


def test_stale_if_error_covers_a_plain_500() -> None:
    key = CacheKey("minilm", "acme", b"k" * 16)
    entry = Entry(value=b"v", created_at=0.0, ttl_s=1.0, stale_while_revalidate_s=0.0,
                  stale_if_error_s=60.0, compute_ms=1.0, meta=b"")
    outcomes: list[Outcome | None] = [None]
    # The rule in force allows as much as the entry (the stricter of the two applies).
    rule = cast(Rule, SimpleNamespace(ttl_s=1.0, stale_if_error_s=60.0))
    assert stale_if_error([entry], [key], outcomes, 30.0, GatewayError("internal error"), rule)
    assert outcomes[0] is not None and outcomes[0].status == "STALE"


async def test_request_text_is_not_logged_by_default(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    assert rig.pipeline.log_request_text is False
    with caplog.at_level(logging.DEBUG, logger="gateway.pipeline"):
        await embed(rig, ["a secret sentence"])
    assert not any("texts" in r.__dict__ for r in caplog.records)
    rig.pipeline.log_request_text = True
    with caplog.at_level(logging.DEBUG, logger="gateway.pipeline"):
        await embed(rig, ["a secret sentence"])
    assert any(r.__dict__.get("texts") == ["a secret sentence"] for r in caplog.records)


async def test_the_result_and_context_carry_the_decision(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    call = parse_embeddings({"model": "minilm", "input": ["a"]}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="acme",
                         deadline=time.monotonic() + 0.5)  # under a second left still calls
    result = await rig.pipeline.run(ctx, call)
    assert (result.cache_status, ctx.cache_status) == ("MISS", "MISS")
    assert result.decision.rule.name == "default"
    assert ctx.policy_tag == result.decision.trail and ctx.policy_tag.startswith("default@unit-1")
    assert result.age_s == 0 and result.outcomes[0].age_s == 0
    entry = (await embed(rig, ["a"])).outcomes[0].entry
    assert entry is not None and entry.compute_ms == pytest.approx(2.0)  # the backend's compute


async def test_a_new_model_version_misses_and_an_unknown_one_is_keyed_apart(
        tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    await embed(rig, ["a"])
    assert statuses(await embed(rig, ["a"])) == ["HIT"]
    rig.pipeline.model_version = lambda _m: "2"
    assert statuses(await embed(rig, ["a"])) == ["MISS"]
    rig.pipeline.model_version = lambda _m: None
    assert statuses(await embed(rig, ["a"])) == ["MISS"]
    assert statuses(await embed(rig, ["a"])) == ["HIT"]
    rig.pipeline.model_version = lambda m: {"minilm": "2"}.get(m)
    assert statuses(await embed(rig, ["a"])) == ["HIT"], "the version is asked for this model"


SHADOW_BY_REQUEST = """
version: shadow-1
rules:
  - name: search-team-only
    match:
      routes: [/v1/embeddings]
      models: [minilm]
      tenants: [acme]
      headers: {x-team: search}
    ttl: 5m
  - name: default
"""


async def test_the_shadow_policy_matches_its_rules_on_the_request_itself(tmp_path: Path) -> None:
    """The shadow comparison an operator reads is only worth something if the shadow policy's
    rules see the request's route, model, tenant and headers, as the active policy's do."""
    active = write_policy(tmp_path)
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(SHADOW_BY_REQUEST)
    rig = await build("embeddings", active)
    rig.pipeline.policies = PolicyStore([active], shadow_paths=[shadow])
    seen: list[Any] = []
    rig.pipeline.policies.compare_shadow = (  # type: ignore[method-assign]
        lambda a, s: seen.append(s) or ())
    call = parse_embeddings({"model": "minilm", "input": ["hello"]}, lambda _name: "minilm")
    for tenant, team, rule in [("acme", "search", "search-team-only"), ("acme", "ads", "default"),
                               ("other", "search", "default")]:
        ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant=tenant,
                             deadline=time.monotonic() + 5.0, headers={"x-team": team})
        await rig.pipeline.run(ctx, call)
        assert seen.pop().rule.name == rule, (tenant, team)


async def test_the_shadow_policy_sees_the_same_request(tmp_path: Path) -> None:
    active = write_policy(tmp_path)
    shadow_dir = tmp_path / "shadow"
    shadow_dir.mkdir()
    shadow = write_policy(shadow_dir, n=9, email="off")
    rig = await build("embeddings", active)
    rig.pipeline.policies = PolicyStore([active], shadow_paths=[shadow])
    seen: list[tuple[Any, Any]] = []
    rig.pipeline.policies.compare_shadow = (  # type: ignore[method-assign]
        lambda a, s: seen.append((a, s)) or ())
    call = parse_embeddings({"model": "minilm", "input": ["mail jane.doe@example.com"]},
                            lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="acme",
                         deadline=time.monotonic() + 5.0, headers={"x-team": "search"})
    result = await rig.pipeline.run(ctx, call)
    ((a, s),) = seen
    assert a is result.decision and a.items[0].store is False
    assert s.policy_version.startswith("unit-9") and s.items[0].store is True and s.scope == "acme"
    assert s.rule.name == "default"
    card = write_policy(shadow_dir, n=10, email="reject")
    await rig.pipeline.policies.reload()
    assert card == shadow
    seen.clear()
    again = await embed(rig, ["mail jane.doe@example.com"])
    # BYPASS: the active policy keeps the e-mail out of the cache (no_store); not a failure.
    assert again.outcomes[0].status == "BYPASS", "a shadow rejection never fails the request"
    assert seen == [(again.decision, None)]


class _StuckL2:
    """An L2 whose writes wait until released (a slow or unreachable Redis)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.stored: list[CacheKey] = []

    async def lookup(self, keys: list[CacheKey]) -> tuple[list[Entry | None], bool]:
        return [None] * len(keys), True

    async def store(self, items: list[tuple[CacheKey, Entry]]) -> int:
        await self.release.wait()
        self.stored += [key for key, _ in items]
        return len(items)


async def test_a_slow_l2_write_never_delays_the_answer(tmp_path: Path) -> None:
    """A miss is answered as soon as the backend answers and L1 holds it; the L2 write goes on
    in the background and is finished by drain() (shutdown)."""
    rig = await build("embeddings", write_policy(tmp_path))
    l2 = _StuckL2()
    rig.pipeline.cache = TieredCache(rig.l1, cast(Any, l2))
    first = await asyncio.wait_for(embed(rig, ["slow l2"]), timeout=5.0)
    assert statuses(first) == ["MISS"] and l2.stored == []
    assert statuses(await embed(rig, ["slow l2"])) == ["HIT"], "L1 holds it at once"
    l2.release.set()
    await asyncio.wait_for(rig.pipeline.drain(), timeout=5.0)
    assert len(l2.stored) == 1


async def test_a_policy_that_shortens_stale_while_revalidate_reaches_stored_entries(
        tmp_path: Path) -> None:
    """Stored under ttl 10 s and swr 1 min; the policy now allows 5 s of swr: at 12 s old the
    entry is stale (inside both windows), at 30 s a miss (inside the entry's own window only)."""
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", swr="1m"))
    await embed(rig, ["a", "b"])
    write_policy(tmp_path, n=2, ttl="10s", swr="5s")
    await rig.pipeline.policies.reload()
    rig.clock.advance(12)
    assert statuses(await embed(rig, ["a"])) == ["STALE"]
    await rig.pipeline.drain()
    rig.clock.advance(18)  # b is 30 s old
    assert statuses(await embed(rig, ["b"])) == ["MISS"]


async def test_a_policy_that_shortens_the_ttl_reaches_stored_entries(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="1h"))
    await embed(rig, ["a"])
    write_policy(tmp_path, n=2, ttl="10s")
    await rig.pipeline.policies.reload()
    rig.clock.advance(20)
    await embed(rig, ["b"])
    # a is past the policy's TTL (the cache still holds it, under its own hour): a miss, and
    # the items after it are still looked at
    assert statuses(await embed(rig, ["a", "b"])) == ["MISS", "HIT"]


async def test_a_policy_that_shortens_stale_if_error_reaches_stored_entries(
        tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", sie="1h"))
    await embed(rig, ["a", "b"])
    write_policy(tmp_path, n=2, ttl="10s", sie="5s")
    await rig.pipeline.policies.reload()
    rig.model.fail = 503
    rig.clock.advance(12)
    assert statuses(await embed(rig, ["a"])) == ["STALE"]
    rig.clock.advance(18)  # b is 30 s old: inside the entry's hour, not the policy's 5 s
    with pytest.raises(GatewayError):  # the backend's 503, or none left after it (shed)
        await embed(rig, ["b"])


async def test_a_stale_if_error_answer_carries_its_key_entry_and_age(tmp_path: Path) -> None:
    """Like any answer from the cache: its age (the Age header), the compute it saved (the
    tenant's usage) and its key and entry (the renderer reuses what it made of them)."""
    rig = await build("embeddings", write_policy(tmp_path, ttl="10s", sie="1h"))
    await embed(rig, ["a"])
    rig.clock.advance(20)
    rig.model.fail = 503
    result = await embed(rig, ["a"])
    (o,) = result.outcomes
    assert o.status == "STALE" and o.age_s == pytest.approx(20.0)
    assert result.age_s == pytest.approx(20.0)
    assert isinstance(o.key, CacheKey) and o.key.scope == "acme"
    assert isinstance(o.entry, Entry) and o.entry.value == o.value
    assert o.entry.compute_ms > 0
    assert usage_of(result.outcomes, 0.0).saved_s == pytest.approx(o.entry.compute_ms / 1000)
