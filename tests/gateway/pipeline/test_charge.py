"""What the pipeline tells the tenant's quota: texts sent to a backend apart from texts answered
from cache, once per request, after the lookup and before any backend call.

The quota turns cached texts into cost with ``hit_cost`` (0 by default: hits are free,
tests/gateway/tenants/test_quota.py); these tests hold the pipeline to the counts it hands over, on
every route, so a hit can never be charged as a backend text.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.adapters.texts import parse_embeddings
from gateway.errors import RateLimited
from gateway.pipeline.context import RequestContext
from tests.gateway.pipeline.rig import ROUTES, Rig, build, write_policy

PII = "write to jane.doe@example.com please"
CLEAN = "a perfectly ordinary sentence"
TEXTS = {"embeddings": 1, "classify": 3, "rank": 3, "oip": 1}  # items per request

routes = pytest.mark.parametrize("route", sorted(ROUTES))


class Charges:
    """Records every charge; ``refuse`` makes it answer 429 like an exhausted quota."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.seen: list[tuple[int, int]] = []
        self.refuse = refuse

    async def __call__(self, backend_texts: int, cached_texts: int) -> None:
        self.seen.append((backend_texts, cached_texts))
        if self.refuse:
            raise RateLimited("quota exceeded", retry_after_s=1.0)


async def embed(rig: Rig, texts: list[str], charges: Charges) -> str:
    call = parse_embeddings({"model": "minilm", "input": texts}, lambda _name: "minilm")
    ctx = RequestContext(request_id="t", route="/v1/embeddings", tenant="acme",
                         deadline=time.monotonic() + 5.0, charge=charges)
    return (await rig.pipeline.run(ctx, call)).cache_status


@routes
async def test_a_miss_is_charged_as_backend_texts_and_a_hit_as_cached(
        route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    charges = Charges()
    first, _ = await rig.ask(CLEAN, charge=charges)
    second, _ = await rig.ask(CLEAN, charge=charges)
    assert (first.cache_status, second.cache_status) == ("MISS", "HIT")
    n = TEXTS[route]
    assert charges.seen == [(n, 0), (0, n)]


async def test_a_partly_cached_list_charges_only_its_misses(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    charges = Charges()
    assert await embed(rig, ["alpha"], charges) == "MISS"
    assert await embed(rig, ["alpha", "beta", "alpha", "gamma", "beta"], charges) == "MISS"
    # beta and gamma go to the backend once each (beta's repeat shares the call and is
    # charged neither way); alpha's two positions are answered from cache.
    assert charges.seen == [(1, 0), (2, 2)]
    assert rig.model.texts[-1] == ["beta", "gamma"]
    assert await embed(rig, ["gamma", "beta"], charges) == "HIT"
    assert charges.seen[-1] == (0, 2)


@routes
async def test_no_store_texts_are_charged_as_backend_texts_every_time(
        route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    charges = Charges()
    await rig.ask(PII, charge=charges)
    await rig.ask(PII, charge=charges)
    n = TEXTS[route]
    if route == "oip":  # one item per request: the whole request is kept out
        assert charges.seen == [(1, 0), (1, 0)]
    else:  # the route's other texts are cached the second time; the PII text never is
        assert charges.seen == [(n, 0), (1, n - 1)]


@routes
async def test_a_refused_charge_reaches_no_backend_and_stores_nothing(
        route: str, tmp_path: Path) -> None:
    rig = await build(route, write_policy(tmp_path))
    with pytest.raises(RateLimited):
        await rig.ask(CLEAN, charge=Charges(refuse=True))
    assert rig.model.calls == 0 and len(rig.l1) == 0
    result, _ = await rig.ask(CLEAN, charge=Charges())
    assert result.cache_status == "MISS"

