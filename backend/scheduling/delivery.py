"""A finished batch back to its callers: each request's results in its own order, with where
its time went; and the worker-thread side that computes a batch's calls, each timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from backend.scheduling.observer import BatchObserver
from backend.scheduling.queue import Slot, Ticket

T = TypeVar("T")
R = TypeVar("R")

# What a worker hands back: per call its results and compute seconds.
Outputs = list[tuple[Sequence[Any], float]]


@dataclass(frozen=True, slots=True)
class BatchOutcome(Generic[R]):
    """One request's results in its own order, with where its time went."""

    results: list[R]
    queue_s: float  # time in the batcher not spent computing this request's batches
    compute_s: float  # compute time of the batches that carried its items
    batch_size: int  # the largest batch that carried its items



def deliver(group: list[Slot], results: Sequence[Any], compute_s: float, now: float,
            observer: BatchObserver) -> None:
    """Hands one call's results to the requests whose items it carried; a request whose last
    result this was is answered."""
    if len(results) != len(group):
        error = RuntimeError(f"compute returned {len(results)} results for {len(group)} items")
        for slot in group:
            fail(slot.req, error)
        return
    charged: set[int] = set()
    for slot, result in zip(group, results, strict=True):
        req = slot.req
        if req.future.done():
            continue
        req.results[slot.index] = result
        if id(req) not in charged:
            charged.add(id(req))
            req.compute_s += compute_s
            req.batch_size = max(req.batch_size, len(group))
        req.remaining -= 1
        if req.remaining == 0:
            queue_s = max(0.0, now - req.enqueued - req.compute_s)
            observer.waited(req.level, queue_s)
            req.future.set_result(
                BatchOutcome(req.results, queue_s, req.compute_s, req.batch_size))


def fail(req: Ticket, exc: BaseException) -> None:
    """Answers ``req`` with ``exc`` unless it is answered already."""
    if not req.future.done():
        req.future.set_exception(exc)


def compute_groups(compute: Callable[[list[T]], Sequence[R]], groups: list[list[T]]
                   ) -> Outputs:
    """Runs in the worker thread: one ``compute`` call per group, each timed."""
    out: Outputs = []
    for items in groups:
        started = time.perf_counter()
        results = compute(items)
        out.append((results, time.perf_counter() - started))
    return out
