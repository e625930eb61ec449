"""A request's cacheable units and how the missing ones are asked of a backend.

This is the pipeline's business, not the route adapter's: an adapter parses a body and renders
an answer; between the two it is not entered. What it tells the pipeline about its units is
data, one of two kinds (the ``unit`` of its ``Call``, gateway/pipeline/call.py):

- ``PER_TEXT`` (``/v1/embeddings``, ``/v1/classify``, ``/v1/rank``): each text of the policy's
  decision is one item, cached on its own; the missing ones go to a backend as BYTES tensors,
  cut into calls within the backend's per-request limits.
- ``PerRequest`` (OIP infer): the whole request is one item. Its canonical bytes are the
  request as the backend gets it (the adapter's ``template``, its BYTES inputs filled in
  row-major order with the policy's normalised or redacted texts), keys sorted; the backend's
  JSON answer is checked and kept without its ``id``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import BackendRejected, BadGateway
from gateway.pipeline.call import Fetched, FetchResult, Item, PerText, Unit
from gateway.pipeline.vectors import pack

if TYPE_CHECKING:
    from gateway.pipeline.context import RequestContext
    from gateway.policy import Decision
    from gateway.upstream import Upstream
    from gateway.upstream.results import InferResult, RawResult

MAX_BACKEND_TEXTS = 256
"""Texts per backend call (the backend's default ``max_items_per_request``): a rank request
(one query and up to 256 documents) or a classify request (inputs and labels) is split."""
MAX_BACKEND_TEXT_BYTES = 1024 * 1024
"""UTF-8 bytes of text per backend call (half the backend's ``max_text_bytes_per_request``)."""


def items_of(unit: Unit, decision: Decision) -> list[Item]:
    """The request's cacheable units, built from the policy's (normalised, redacted) texts. An
    item that may not be stored is not read from a cache either."""
    if isinstance(unit, PerText):
        return [Item(d.text.encode("utf-8"), d.store) for d in decision.items]
    body = unit.outgoing([d.text for d in decision.items])
    return [Item(orjson.dumps(body, option=orjson.OPT_SORT_KEYS),
                 all(d.store for d in decision.items))]


async def fetch(unit: Unit, upstream: Upstream, ctx: RequestContext, model: str,
                decision: Decision, indexes: Sequence[int]) -> FetchResult:
    """Ask a backend for the items at ``indexes`` (of ``items_of``), in order."""
    if isinstance(unit, PerText):
        return await _fetch_texts(upstream, ctx, model, [decision.items[i].text for i in indexes])
    deadline = ctx.deadline if unit.client_timeout_s is None \
        else min(ctx.deadline, time.monotonic() + unit.client_timeout_s)
    raw = await upstream.infer_raw(model, unit.outgoing([d.text for d in decision.items]),
                                   request_id=ctx.request_id, deadline=deadline,
                                   tenant=ctx.tenant, priority=ctx.priority, route=ctx.route,
                                   client_priority=unit.client_priority)
    answer, queue_ms, compute_ms = oip_answer(raw)
    return FetchResult([Fetched(answer, b"", compute_ms)], queue_ms, compute_ms)


async def _fetch_texts(upstream: Upstream, ctx: RequestContext, model: str,
                       texts: list[str]) -> FetchResult:
    batches = backend_batches(texts)

    def call(part: list[str]) -> Coroutine[Any, Any, InferResult]:
        return upstream.infer_texts(model, part, request_id=ctx.request_id, deadline=ctx.deadline,
                                    tenant=ctx.tenant, priority=ctx.priority, route=ctx.route)

    if len(batches) == 1:  # the common case: awaited here, without a task and a gather
        parts: Sequence[InferResult] = [await call(batches[0])]
    else:
        parts = await asyncio.gather(*(call(part) for part in batches))
    items: list[Fetched] = []
    for part in parts:
        n = len(part.embeddings)
        per_item = part.compute_ms / max(1, n)
        counts = part.token_counts or [0] * n
        items.extend(pack(part.embeddings[i], counts[i], per_item) for i in range(n))
    return FetchResult(items, max(p.queue_ms for p in parts), sum(p.compute_ms for p in parts))


def backend_batches(texts: Sequence[str]) -> list[list[str]]:
    """``texts`` in order, cut into calls within the backend's per-request limits."""
    batches: list[list[str]] = [[]]
    size = 0
    for text in texts:
        n = len(text.encode("utf-8"))
        if batches[-1] and (len(batches[-1]) >= MAX_BACKEND_TEXTS
                            or size + n > MAX_BACKEND_TEXT_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(text)
        size += n
    return batches


def oip_answer(raw: RawResult) -> tuple[bytes, float, float]:
    """A backend's OIP JSON answer checked (4xx passed on as the client's error, anything else
    not 200 or without outputs a bad gateway), without its ``id``; with the queue and compute
    times it reported."""
    try:
        answer = orjson.loads(raw.body)
    except orjson.JSONDecodeError:
        raise BadGateway(f"backend {raw.backend} answered with invalid JSON") from None
    if 400 <= raw.status < 500:
        message = answer.get("error") if isinstance(answer, dict) else None
        raise BackendRejected.for_status(raw.status, str(message or "no message")[:200])
    if raw.status != 200:
        raise BadGateway(f"backend {raw.backend} answered {raw.status}")
    if not isinstance(answer, dict) or not isinstance(answer.get("outputs"), list):
        raise BadGateway(f"backend {raw.backend} answered without outputs")
    answer.pop("id", None)
    timing = raw.timing_ms
    return orjson.dumps(answer), timing.get("queue", 0.0), timing.get("compute", 0.0)
