"""The dynamic batcher with a small real compute function (not the model), to stay fast."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from backend.scheduling import (
    BatcherClosed,
    DeadlineExpired,
    DynamicBatcher,
    QueueFull,
)
from backend.scheduling.grouping import choose_window, plan_groups


class Doubler:
    """Doubles ints; records every call; can hold a worker on a gate to build a backlog.

    Each held item has its own gate, so with several workers each can be held and released
    on its own: events, never sleeps, decide what the batcher sees.
    """

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gates: dict[int, threading.Event] = {}
        self.started: dict[int, threading.Event] = {}
        self.fail_on: int | None = None

    def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        for item in items:
            if item in self.started:
                self.started[item].set()
                if not self.gates[item].wait(10):
                    raise TimeoutError("test gate never opened")
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("poisoned item")
        return [2 * x for x in items]

    async def hold(self, batcher: DynamicBatcher[int, int], item: int = 1000
                   ) -> asyncio.Task[object]:
        """Occupies a worker with ``item`` until ``release(item)``."""
        self.gates[item] = threading.Event()
        self.started[item] = threading.Event()
        task: asyncio.Task[object] = asyncio.create_task(batcher.submit([item]))
        assert await asyncio.to_thread(self.started[item].wait, 5)
        return task

    def release(self, item: int = 1000) -> None:
        self.gates[item].set()

    @property
    def computed(self) -> list[int]:
        return [x for call in self.calls for x in call]


BatcherFactory = Callable[..., DynamicBatcher[int, int]]


@pytest.fixture
async def make() -> AsyncIterator[BatcherFactory]:
    made: list[tuple[DynamicBatcher[int, int], Doubler]] = []

    def factory(compute: Doubler, **kwargs: object) -> DynamicBatcher[int, int]:
        options: dict[str, object] = {
            "max_batch_size": 4, "max_queue_size": 64, "size_of": lambda x: x,
        }
        options.update(kwargs)
        batcher: DynamicBatcher[int, int] = DynamicBatcher(compute, **options)  # type: ignore[arg-type]
        batcher.start()
        made.append((batcher, compute))
        return batcher

    yield factory
    for batcher, compute in made:
        for gate in compute.gates.values():  # a failed test must not leave a worker held
            gate.set()
        await batcher.close()


async def until(condition: Callable[[], bool]) -> None:
    """Lets the event loop run until ``condition`` holds (bounded: 1000 turns)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_a_lone_request_is_computed_at_once_and_alone(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=32)
    # Nothing else will ever arrive: a batcher that waited for company would time out here.
    outcome = await asyncio.wait_for(batcher.submit([7]), timeout=5)
    assert outcome.results == [14]
    assert outcome.batch_size == 1
    assert compute.calls == [[7]]


async def test_a_burst_on_an_idle_worker_starts_at_once_and_the_rest_ride_together(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=8)
    outcomes = await asyncio.gather(*(batcher.submit([i]) for i in range(1, 6)))
    assert [o.results for o in outcomes] == [[2], [4], [6], [8], [10]]
    # The first found the worker free and went alone; the others arrived while it computed.
    assert compute.calls == [[1], [2, 3, 4, 5]]
    assert [o.batch_size for o in outcomes] == [1, 4, 4, 4, 4]
    assert all(o.compute_s > 0 and o.queue_s >= 0 for o in outcomes)


async def test_requests_arriving_while_the_worker_is_busy_are_batched_together(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=8)
    held = await compute.hold(batcher)
    waiting = []
    for count, i in enumerate((3, 1, 2), start=1):  # one at a time, each in its own loop turn
        waiting.append(asyncio.create_task(batcher.submit([i])))
        await until(lambda n=count: batcher.depth == n)
    assert compute.calls == [[1000]]  # nothing dispatched while the only worker is busy
    compute.release()
    await held
    outcomes = await asyncio.wait_for(asyncio.gather(*waiting), timeout=5)
    assert [o.results for o in outcomes] == [[6], [2], [4]]
    assert compute.calls[1:] == [[1, 2, 3]]  # the freed worker took them at once, together
    assert all(o.batch_size == 3 for o in outcomes)


async def test_requests_wait_only_while_every_worker_is_busy(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute, workers=2, max_batch_size=8)
    first = await compute.hold(batcher, 1000)
    # One worker busy, one free: a lone request goes to the free one at once.
    assert (await asyncio.wait_for(batcher.submit([5]), timeout=5)).batch_size == 1
    second = await compute.hold(batcher, 2000)
    assert batcher.busy_workers == 2
    waiting = [asyncio.create_task(batcher.submit([i])) for i in (1, 2)]
    await until(lambda: batcher.depth == 2)
    compute.release(1000)  # the first worker to free up takes both, at once
    outcomes = await asyncio.wait_for(asyncio.gather(*waiting), timeout=5)
    assert [o.results for o in outcomes] == [[2], [4]]
    assert [1, 2] in compute.calls
    assert batcher.busy_workers == 1  # the other worker is still held
    compute.release(2000)
    await asyncio.gather(first, second)


async def test_one_request_split_across_batches_comes_back_in_order(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=3)
    items = [9, 1, 7, 3, 8, 2, 6, 4, 5, 10]
    outcome = await batcher.submit(items)
    assert outcome.results == [2 * x for x in items]
    assert all(len(call) <= 3 for call in compute.calls)
    assert sorted(compute.computed) == sorted(items)
    assert outcome.batch_size == 3


async def test_one_keys_backlog_goes_oldest_first_and_runs_as_calls_by_length(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=4)
    held = await compute.hold(batcher)
    sizes = [5, 200, 6, 201, 7, 202, 8, 203]
    waiting = [asyncio.create_task(batcher.submit([s])) for s in sizes]
    await until(lambda: batcher.depth == len(sizes))
    compute.release()
    await held
    results = await asyncio.gather(*waiting)
    assert [r.results[0] for r in results] == [2 * s for s in sizes]
    # Arrival order picks the batch (fairness and deadlines act on it); inside a batch the
    # items are sorted by length and very mixed lengths run as separate calls.
    assert compute.calls[1:] == [[5, 6], [200, 201], [7, 8], [202, 203]]


async def test_queue_full_is_refused_at_once(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=4, max_queue_size=4)
    held = await compute.hold(batcher)
    queued = asyncio.create_task(batcher.submit([1, 2, 3, 4]))
    await until(lambda: batcher.depth == 4)
    with pytest.raises(QueueFull, match="4 of 4 items waiting"):
        await batcher.submit([5])
    compute.release()
    await held
    assert (await queued).results == [2, 4, 6, 8]
    assert 5 not in compute.computed
    assert (await batcher.submit([5])).results == [10]  # room again once drained


async def test_expired_request_is_dropped_before_compute(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute)
    held = await compute.hold(batcher)
    with pytest.raises(DeadlineExpired):
        await batcher.submit([77], timeout_s=0.05)
    assert batcher.depth == 0
    compute.release()
    await held
    assert (await batcher.submit([3])).results == [6]
    assert 77 not in compute.computed


async def test_cancelled_request_leaves_the_queue(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute)
    held = await compute.hold(batcher)
    waiting = asyncio.create_task(batcher.submit([55, 56]))
    await until(lambda: batcher.depth == 2)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert batcher.depth == 0
    compute.release()
    await held
    assert 55 not in compute.computed


async def test_compute_error_reaches_its_batch_and_the_batcher_goes_on(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    compute.fail_on = 13
    batcher = make(compute)
    held = await compute.hold(batcher)
    bad, good = (asyncio.create_task(batcher.submit([x])) for x in (13, 2))
    await until(lambda: batcher.depth == 2)
    compute.release()
    await held
    results = await asyncio.gather(bad, good, return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)  # one batch, one failure
    assert (await batcher.submit([2])).results == [4]


async def test_close_fails_queued_requests(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute)
    held = await compute.hold(batcher)
    queued = asyncio.create_task(batcher.submit([4]))
    await until(lambda: batcher.depth == 1)
    compute.release()
    await batcher.close()
    await held
    with pytest.raises(BatcherClosed):
        await queued
    with pytest.raises(BatcherClosed):
        await batcher.submit([1])


async def test_close_waits_for_running_batches_and_delivers_them(make: BatcherFactory) -> None:
    compute = Doubler()
    batcher = make(compute)
    held = await compute.hold(batcher)
    closing = asyncio.create_task(batcher.close())
    await until(lambda: batcher.depth == 0 and not closing.done())
    compute.release()
    await asyncio.wait_for(closing, timeout=5)
    assert (await held).results == [2000]  # type: ignore[attr-defined]


def test_window_holds_the_oldest_and_pads_least() -> None:
    sizes = [1, 2, 3, 50, 51, 52, 53, 100]
    assert choose_window(sizes, must=4, width=4) == 3  # 50..53, not 2..51
    assert choose_window(sizes, must=0, width=4) == 0
    assert choose_window(sizes, must=7, width=4) == 4


def test_mixed_lengths_split_only_when_padding_outweighs_a_call() -> None:
    assert plan_groups([8] * 31 + [256], split_cost=32) == [(0, 31), (31, 32)]
    assert plan_groups([8, 9, 10, 12, 16], split_cost=32) == [(0, 5)]
    assert plan_groups([], split_cost=32) == []


def test_calls_are_capped_in_padded_size_but_never_below_one_item() -> None:
    assert plan_groups([196] * 8, split_cost=32, max_call_size=512) == \
        [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert plan_groups([9] * 32, split_cost=32, max_call_size=512) == [(0, 32)]
    assert plan_groups([64] * 10, split_cost=32, max_call_size=512) == [(0, 5), (5, 10)]
    assert plan_groups([600, 700], split_cost=32, max_call_size=512) == [(0, 1), (1, 2)]
    assert plan_groups([8] * 31 + [256], split_cost=32, max_call_size=512) == \
        [(0, 31), (31, 32)]


async def test_a_capped_batch_runs_as_several_calls_in_one_worker_turn(
    make: BatcherFactory,
) -> None:
    compute = Doubler()
    batcher = make(compute, max_batch_size=8, max_call_size=250)
    outcomes = await asyncio.gather(*(batcher.submit([100 + i]) for i in range(5)))
    assert [o.results[0] for o in outcomes] == [200, 202, 204, 206, 208]
    assert compute.calls == [[100], [101, 102], [103, 104]]  # even, each 2 x size <= 250
    assert [o.batch_size for o in outcomes] == [1, 2, 2, 2, 2]
