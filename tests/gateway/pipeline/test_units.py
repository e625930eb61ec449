"""The adapter is entered to parse and to render only: a Call that is data plus ``render`` runs
the whole pipeline (items, keys, lookup, backend call, store), and the two kinds of unit
behave as the pipeline promises."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import orjson

from gateway.adapters.oip import parse_oip
from gateway.pipeline import HIT, MISS, PER_TEXT, PerText, Result
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.pipeline.units import MAX_BACKEND_TEXTS, backend_batches, items_of
from gateway.pipeline.vectors import vector
from gateway.upstream import Reply, Request
from tests.gateway.pipeline.rig import build, write_policy


@dataclass(frozen=True)
class Similarity:
    """A new route's Call, as a newcomer would write it: no items, no fetch, no groups()."""

    model: str
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    unit: PerText = PER_TEXT

    def render(self, result: Result) -> bytes:
        a, b = (vector(o) for o in result.outcomes)
        return orjson.dumps({"similarity": round(float(a @ b), 6)})


async def test_a_call_of_data_and_render_runs_the_whole_pipeline(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))

    def ctx() -> RequestContext:
        return RequestContext(request_id="t", route="/v1/similarity",
                              deadline=rig.clock() + 10**9, directives=CacheDirectives())

    call = Similarity(model="minilm", groups=(("texts", ("one text", "another text")),))
    first = await rig.pipeline.run(ctx(), call)
    assert [o.status for o in first.outcomes] == [MISS, MISS] and rig.model.calls == 1
    again = await rig.pipeline.run(ctx(), call)
    assert [o.status for o in again.outcomes] == [HIT, HIT] and rig.model.calls == 1
    assert call.render(again) == call.render(first)


def test_per_text_items_are_the_policys_texts_per_request_one_item_of_the_filled_template(
) -> None:
    call = parse_oip({"id": "x", "parameters": {"priority": 2, "binary_data_output": True},
                      "inputs": [{"name": "a", "datatype": "BYTES", "shape": [2, 1],
                                  "data": [["p"], ["q"]]},
                                 {"name": "b", "datatype": "BYTES", "shape": [1],
                                  "data": ["r"]}]}, "minilm")

    @dataclass
    class Item:
        text: str
        store: bool = True

    @dataclass
    class Decision:
        items: list[Item]

    decision = Decision([Item("P"), Item("Q"), Item("R", store=False)])
    (item,) = items_of(call.unit, decision)  # type: ignore[arg-type]
    assert not item.store  # one text the policy forbids to store: the request is not stored
    sent = orjson.loads(item.canonical)
    assert "id" not in sent and "parameters" not in sent  # no id, no binary, no scheduling
    assert [t["data"] for t in sent["inputs"]] == [["P", "Q"], ["R"]]  # the policy's texts
    assert [t["shape"] for t in sent["inputs"]] == [[2, 1], [1]]
    assert call.unit.client_priority == 2 and call.request_id == "x"
    texts = items_of(PER_TEXT, decision)  # type: ignore[arg-type]
    assert [(i.canonical, i.store) for i in texts] == [(b"P", True), (b"Q", True),
                                                       (b"R", False)]


def test_backend_batches_keep_order_within_the_per_call_limits() -> None:
    texts = [f"t{i}" for i in range(MAX_BACKEND_TEXTS * 2 + 1)]
    batches = backend_batches(texts)
    assert [len(b) for b in batches] == [MAX_BACKEND_TEXTS, MAX_BACKEND_TEXTS, 1]
    assert [t for b in batches for t in b] == texts
    big = ["x" * (600 * 1024), "y" * (600 * 1024), "z"]
    assert [len(b) for b in backend_batches(big)] == [1, 2]


async def test_one_backend_batch_is_awaited_in_the_requests_own_task(tmp_path: Path) -> None:
    """A miss whose texts fit one backend call runs it in the request's task: no task and no
    gather per miss (issue 24)."""
    rig = await build("embeddings", write_policy(tmp_path))
    tasks_seen: list[int] = []
    answer = rig.model.__call__

    async def counting(request: Request) -> Reply:
        tasks_seen.append(len(asyncio.all_tasks()))
        return await answer(request)

    transport = rig.pipeline.upstream._transport
    transport.handler = counting  # type: ignore[attr-defined]

    def ctx() -> RequestContext:
        return RequestContext(request_id="t", route="/v1/similarity",
                              deadline=rig.clock() + 10**9, directives=CacheDirectives())

    call = Similarity(model="minilm", groups=(("texts", ("one text", "another text")),))
    await rig.pipeline.run(ctx(), call)
    assert tasks_seen == [len(asyncio.all_tasks())]  # only the test's own task

