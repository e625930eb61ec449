"""The adapter is entered to parse and to render only: a Call that is data plus ``render`` runs
the whole pipeline (items, keys, lookup, backend call, store), and the two kinds of unit
behave as the pipeline promises."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.adapters.oip import parse_oip
from gateway.adapters.texts import parse_embeddings, parse_rank
from gateway.errors import (
    BackendBadRequest,
    BackendNotFound,
    BackendPayloadTooLarge,
    BackendRejected,
    BadGateway,
)
from gateway.pipeline import HIT, MISS, PER_TEXT, PerText, Result
from gateway.pipeline.accounting import usage_of
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.pipeline.units import (
    MAX_BACKEND_TEXT_BYTES,
    MAX_BACKEND_TEXTS,
    backend_batches,
    items_of,
    oip_answer,
)
from gateway.pipeline.vectors import tokens, vector
from gateway.upstream import Reply, Request
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, Priority
from gateway.upstream.results import RawResult
from gateway.upstream.schedule import Schedule
from tests.gateway.pipeline.rig import build, write_policy
from tests.gateway.pipeline.rig import vector as rig_vector


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


# What a backend call carries and what comes back, through the in-memory rig (no sockets):
# written to kill the mutants of units.py that the full mutation run found surviving.

OIP_PATH = "/v2/models/{name}/infer"


def run_ctx(route: str, *, priority: Priority = INTERACTIVE,
            cache_control: str | None = None) -> RequestContext:
    return RequestContext(request_id="t", route=route, tenant="acme", priority=priority,
                          deadline=time.monotonic() + 60.0,
                          directives=CacheDirectives.parse(cache_control))


def oip_body(text: str, **parameters: int) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                        "data": [text]}]}
    if parameters:
        body["parameters"] = parameters
    return body


def route_priority(route: str, number: int) -> Schedule:
    """Tenant acme's calls on ``route`` get backend priority ``number`` (the tenants file's
    ``route_priority``); other routes keep the class's (interactive 1, batch 3)."""
    return Schedule(tenant_priority=lambda _t: (INTERACTIVE, None, {route: number}))


async def test_an_oip_call_carries_its_model_route_class_and_the_clients_own_schedule(
        tmp_path: Path) -> None:
    rig = await build("oip", write_policy(tmp_path))
    rig.pipeline.upstream.schedule = route_priority(OIP_PATH, 2)
    for text, priority, params in (("plain", INTERACTIVE, {}),
                                   ("a batch job's", BATCH, {}),
                                   ("a lowered one", INTERACTIVE, {"priority": 5}),
                                   ("a short one", INTERACTIVE, {"timeout": 2_000_000})):
        await rig.pipeline.run(run_ctx(OIP_PATH, priority=priority),
                               parse_oip(oip_body(text, **params), "minilm"))
    assert rig.model.urls == ["http://fake:1/v2/models/minilm/infer"] * 4
    # the route's priority; a batch call never above the batch number; the client's own
    # priority may only lower it
    assert [p["priority"] for p in rig.model.params] == [2, 3, 5, 2]
    # the client's timeout (2 s, in microseconds) shortens the call's 60 s deadline
    allowed = [int(h["X-Request-Timeout-Ms"]) for h in rig.model.headers]
    assert allowed[0] > 2000 and allowed[1] > 2000 and 0 < allowed[3] <= 2000


async def test_a_text_call_carries_its_model_route_and_class(tmp_path: Path) -> None:
    rig = await build("embeddings", write_policy(tmp_path))
    rig.pipeline.upstream.schedule = route_priority("/v1/embeddings", 2)
    for text, priority in (("plain", INTERACTIVE), ("a batch job's", BATCH)):
        call = parse_embeddings({"model": "minilm", "input": [text]}, lambda _n: "minilm")
        await rig.pipeline.run(run_ctx("/v1/embeddings", priority=priority), call)
    assert rig.model.urls == ["http://fake:1/v2/models/minilm/infer"] * 2
    assert [p["priority"] for p in rig.model.params] == [2, 3]


async def test_server_timing_has_the_backends_queue_and_compute_times(tmp_path: Path) -> None:
    """The backend reports queue 0.5 ms and compute 2 ms per call (rig.FakeModel): one call
    passes them on; two calls (more texts than one call takes) ran side by side, so the
    queue time is the longest and the compute time the sum."""
    rig = await build("oip", write_policy(tmp_path))
    ctx = run_ctx(OIP_PATH)
    await rig.pipeline.run(ctx, parse_oip(oip_body("one"), "minilm"))
    assert (ctx.timings["queue"], ctx.timings["compute"]) == (0.5, 2.0)
    rig = await build("rank", write_policy(tmp_path))
    for n, calls, compute in ((1, 1, 2.0), (MAX_BACKEND_TEXTS, 3, 4.0)):
        ctx = run_ctx("/v1/rank")  # a query and n documents: n + 1 texts
        docs = [f"document {n} {i}" for i in range(n)]
        await rig.pipeline.run(ctx, parse_rank({"model": "minilm", "query": f"q{n}",
                                                "documents": docs}, lambda _n: "minilm"))
        assert rig.model.calls == calls
        assert (ctx.timings["queue"], ctx.timings["compute"]) == (0.5, compute)


async def test_each_text_is_stored_with_its_embedding_tokens_and_share_of_compute(
        tmp_path: Path) -> None:
    """A call's compute time is shared between its texts (what a later hit reports saved);
    a backend that reports no token counts leaves them 0, never a guess."""
    rig = await build("embeddings", write_policy(tmp_path))
    texts = ["first text", "second text", "third text", "fourth text"]
    call = parse_embeddings({"model": "minilm", "input": texts}, lambda _n: "minilm")
    miss = await rig.pipeline.run(run_ctx("/v1/embeddings"), call)
    hit = await rig.pipeline.run(run_ctx("/v1/embeddings"), call)
    assert [o.status for o in hit.outcomes] == [HIT] * 4
    assert [o.entry.compute_ms for o in hit.outcomes if o.entry] == [0.5] * 4
    assert usage_of(hit.outcomes, 0.0).saved_s == 0.002
    for result in (miss, hit):
        assert [vector(o).tolist() for o in result.outcomes] == [
            pytest.approx(rig_vector(t)) for t in texts]
        assert [tokens(o) for o in result.outcomes] == [4] * 4
    rig.model.token_counts = False
    quiet = await rig.pipeline.run(run_ctx("/v1/embeddings"), parse_embeddings(
        {"model": "minilm", "input": ["fifth text", "sixth text"]}, lambda _n: "minilm"))
    assert [tokens(o) for o in quiet.outcomes] == [0, 0]
    assert orjson.loads(Similarity("minilm", ()).render(quiet))["similarity"] == round(
        float(np.dot(rig_vector("fifth text"), rig_vector("sixth text"))), 6)


async def test_an_oip_answer_is_kept_without_metadata(tmp_path: Path) -> None:
    rig = await build("oip", write_policy(tmp_path))
    result = await rig.pipeline.run(run_ctx(OIP_PATH), parse_oip(oip_body("one"), "minilm"))
    assert [o.meta for o in result.outcomes] == [b""]
    assert [tokens(o) for o in result.outcomes] == [0]


async def test_one_oip_request_written_with_its_keys_in_another_order_is_a_hit(
        tmp_path: Path) -> None:
    rig = await build("oip", write_policy(tmp_path))
    first = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["t"]}],
             "outputs": [{"name": "embedding"}]}
    second = {"outputs": [{"name": "embedding"}],
              "inputs": [{"data": ["t"], "shape": [1], "datatype": "BYTES", "name": "text"}]}
    a = await rig.pipeline.run(run_ctx(OIP_PATH), parse_oip(first, "minilm"))
    b = await rig.pipeline.run(run_ctx(OIP_PATH), parse_oip(second, "minilm"))
    assert (a.cache_status, b.cache_status) == (MISS, HIT) and rig.model.calls == 1
    assert b.outcomes[0].value == a.outcomes[0].value


def test_backend_batches_fill_a_call_up_to_exactly_its_byte_limit() -> None:
    half = MAX_BACKEND_TEXT_BYTES // 2
    exact = ["a" * half, "b" * half]
    assert backend_batches(exact) == [exact]  # exactly the limit: one call
    assert backend_batches([*exact, "c"]) == [exact, ["c"]]  # one byte more: the next call
    # after a cut, the next call counts from zero and adds up every text's bytes
    full = "x" * MAX_BACKEND_TEXT_BYTES
    assert backend_batches([full, *exact, "c"]) == [[full], exact, ["c"]]
    thirds = ["p" * (MAX_BACKEND_TEXT_BYTES // 3)] * 3
    assert backend_batches([*thirds, "q" * 10]) == [thirds, ["q" * 10]]


def raw(status: int, body: object, headers: dict[str, str] | None = None) -> RawResult:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return RawResult(status, data, headers or {}, backend="b1")


@pytest.mark.parametrize(("status", "body", "error", "message"), [
    (400, {"error": "shape [2] does not match"}, BackendBadRequest,
     "backend refused the request: shape [2] does not match"),
    (404, {"error": "no model"}, BackendNotFound, "backend refused the request: no model"),
    (413, {"error": "too big"}, BackendPayloadTooLarge, "backend refused the request: too big"),
    (499, {"error": "x" * 300}, BackendRejected, "backend refused the request: " + "x" * 200),
    (422, {"message": "elsewhere"}, BackendRejected, "backend refused the request: no message"),
    (400, ["not", "an", "object"], BackendBadRequest, "backend refused the request: no message"),
    (500, {"error": "down"}, BadGateway, "backend b1 answered 500"),
    (302, {"outputs": []}, BadGateway, "backend b1 answered 302"),
    (399, {"outputs": []}, BadGateway, "backend b1 answered 399"),
    (200, b"{not json", BadGateway, "backend b1 answered with invalid JSON"),
    (200, {"model_name": "m"}, BadGateway, "backend b1 answered without outputs"),
    (200, {"outputs": {"name": "e"}}, BadGateway, "backend b1 answered without outputs"),
    (200, [{"outputs": []}], BadGateway, "backend b1 answered without outputs"),
])
def test_a_backends_oip_answer_is_checked(status: int, body: object, error: type[Exception],
                                          message: str) -> None:
    """4xx: the client's error with the backend's message (cut to 200 characters); anything
    else not 200, or without outputs: a bad gateway naming the backend (for the logs)."""
    with pytest.raises(error) as err:
        oip_answer(raw(status, body))
    assert type(err.value) is error and str(err.value) == message


def test_an_oip_answer_is_kept_without_its_id_with_the_backends_times() -> None:
    answer = {"id": "theirs", "model_name": "m", "outputs": [{"name": "e", "data": [1]}]}
    kept, queue_ms, compute_ms = oip_answer(
        raw(200, answer, {"Server-Timing": "queue;dur=1.5, compute;dur=7"}))
    assert orjson.loads(kept) == {"model_name": "m", "outputs": [{"name": "e", "data": [1]}]}
    assert (queue_ms, compute_ms) == (1.5, 7.0)
    assert oip_answer(raw(200, {"outputs": []}))[1:] == (0.0, 0.0)  # no Server-Timing
