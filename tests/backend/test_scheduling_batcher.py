"""The batcher over the scheduled queue: priority, fairness, victims and deadlines, with a real
worker thread (a small compute function held on gates) and an injected clock for deadlines."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

from backend.scheduling import (
    DeadlineExpired,
    DynamicBatcher,
    QueueFull,
    SchedulePolicy,
    WouldMissDeadline,
)
from backend.scheduling.cost import CostModel
from backend.scheduling.observer import BatchObserver
from tests.backend.test_batching import Doubler, until


class Clock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FixedCost(CostModel):
    """Costs as taught here, unmoved by the test's own (instant or gated) compute calls."""

    def __init__(self, per_token_s: float = 0.0) -> None:
        super().__init__()
        if per_token_s:
            for tokens in (10, 20):  # two sizes: the fit finds no overhead
                super().observe(tokens, tokens * per_token_s)

    def observe(self, tokens: int, seconds: float) -> None:
        pass


def batcher_of(compute: Doubler, clock: Clock, *, max_batch_size: int = 4,
               per_token_s: float = 0.0, observer: BatchObserver | None = None,
               **policy: object) -> DynamicBatcher[int, int]:
    options: dict[str, object] = {"levels": 3, "max_queue_size": 64, "default_timeout_s": 60.0,
                                  "default_priority": 2}
    options.update(policy)
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        compute, max_batch_size=max_batch_size, size_of=lambda _: 10, clock=clock,
        cost=FixedCost(per_token_s), observer=observer,
        policy=SchedulePolicy.uniform(**options))  # type: ignore[arg-type]
    batcher.start()
    return batcher


async def test_higher_priorities_are_computed_first_whatever_the_arrival_order() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, max_batch_size=2)
    held = await compute.hold(batcher)
    low = asyncio.create_task(batcher.submit([1, 2], priority=3))
    default = asyncio.create_task(batcher.submit([3]))  # 0: the default, level 2
    high = asyncio.create_task(batcher.submit([4, 5], priority=1))
    await until(lambda: batcher.depth == 5)
    compute.release()
    await asyncio.gather(held, low, default, high)
    # Batch 2: the default level's 3, then the room filled from the lowest (calls run in
    # length, then arrival, order).
    assert compute.calls[1:] == [[4, 5], [1, 3], [2]]
    await batcher.close()


async def test_a_quiet_key_is_served_before_a_floods_backlog() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, max_batch_size=4)
    held = await compute.hold(batcher)
    flood = [asyncio.create_task(batcher.submit([i], key="A")) for i in range(1, 21)]
    await until(lambda: batcher.depth == 20)
    quiet = asyncio.create_task(batcher.submit([500], key="B"))
    await until(lambda: batcher.depth == 21)
    compute.release()
    await asyncio.gather(held, quiet, *flood)
    # B arrived after all 20 of A's and rides in the very next batch.
    assert 500 in compute.calls[1]
    await batcher.close()


async def test_each_priority_has_its_own_bound_and_the_victim_is_the_newcomer() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, queue_sizes=(8, 8, 2))
    held = await compute.hold(batcher)
    queued = asyncio.create_task(batcher.submit([1, 2], priority=3))
    await until(lambda: batcher.depth == 2)
    with pytest.raises(QueueFull, match="2 of 2 items waiting at priority 3"):
        await batcher.submit([3], priority=3)
    high = asyncio.create_task(batcher.submit([4, 5, 6], priority=1))  # its own room
    await until(lambda: batcher.depth == 5)
    compute.release()
    await asyncio.gather(held, queued, high)
    assert 3 not in compute.computed
    await batcher.close()


async def test_a_deadline_passed_in_the_queue_is_dropped_at_the_next_batch_by_the_clock(
) -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock)
    held = await compute.hold(batcher)
    doomed = asyncio.create_task(batcher.submit([7], timeout_s=5.0))
    kept = asyncio.create_task(batcher.submit([8], timeout_s=50.0))
    await until(lambda: batcher.depth == 2)
    clock.now += 6.0  # past the first deadline, by the batcher's clock only
    compute.release()
    await held
    with pytest.raises(DeadlineExpired, match="deadline passed while queued"):
        await doomed
    assert (await kept).results == [16]
    assert 7 not in compute.computed
    await batcher.close()


async def test_the_timer_answers_an_expired_request_at_its_deadline_not_after() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock)
    held = await compute.hold(batcher)
    with pytest.raises(DeadlineExpired, match="deadline of 20 ms passed"):
        await asyncio.wait_for(batcher.submit([7], timeout_s=0.02), timeout=5)
    assert batcher.depth == 0  # left the queue with its answer
    compute.release()
    await held
    assert 7 not in compute.computed
    await batcher.close()


async def test_a_request_the_work_ahead_outlasts_is_refused_on_arrival() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, per_token_s=0.001)  # 10 ms per item here
    held = await compute.hold(batcher)
    backlog = asyncio.create_task(batcher.submit(list(range(1, 11)), key="A"))  # 100 ms
    await until(lambda: batcher.depth == 10)
    # Same key, behind all ten: 110 ms of compute for a 50 ms deadline.
    with pytest.raises(WouldMissDeadline, match="exceed the deadline of 50 ms"):
        await batcher.submit([11], key="A", timeout_s=0.05)
    # Another key waits only for its fair share (10 ms of A's, 10 of its own).
    other = asyncio.create_task(batcher.submit([12], key="B", timeout_s=0.05))
    await until(lambda: batcher.depth == 11)
    compute.release()
    await asyncio.gather(held, backlog, other)
    assert 11 not in compute.computed and 12 in compute.calls[1]
    await batcher.close()


async def test_a_request_that_cannot_finish_in_time_when_its_turn_comes_is_not_computed(
) -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, per_token_s=0.001)
    held = await compute.hold(batcher)
    hopeful = asyncio.create_task(batcher.submit([9], timeout_s=0.5))
    fine = asyncio.create_task(batcher.submit([10], timeout_s=30.0))
    await until(lambda: batcher.depth == 2)
    clock.now += 0.495  # 5 ms left: less than its 10 ms of compute
    compute.release()
    await held
    with pytest.raises(DeadlineExpired, match="could not end before its deadline"):
        await hopeful
    assert (await fine).results == [20]
    assert 9 not in compute.computed
    await batcher.close()


async def test_batches_stay_within_the_compute_bound_while_work_waits() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock, max_batch_size=32, max_batch_compute_s=0.025,
                         per_token_s=0.001)
    held = await compute.hold(batcher)
    backlog = asyncio.create_task(batcher.submit(list(range(1, 9))))
    await until(lambda: batcher.depth == 8)
    compute.release()
    await asyncio.gather(held, backlog)
    assert [len(call) for call in compute.calls[1:]] == [2, 2, 2, 2]  # 20 ms each, not 80
    await batcher.close()


async def until_s(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Waits (in time, not loop turns: a worker thread must get the CPU) for ``condition``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.005)


class Events:
    """A ``BatchObserver`` that keeps what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, object, object]] = []

    def batch_computed(self, size: int, compute_s: float) -> None:
        self.heard.append(("computed", size, None))

    def waited(self, level: int, seconds: float) -> None:
        self.heard.append(("waited", level, None))

    def dropped(self, level: int, reason: str) -> None:
        self.heard.append(("dropped", level, reason))

    def rejected(self, level: int, reason: str) -> None:
        self.heard.append(("rejected", level, reason))

    def express_batch(self, size: int) -> None:
        self.heard.append(("express", size, None))


async def test_a_lone_request_goes_to_an_idle_worker_at_once_and_is_counted_as_queued_ones(
) -> None:
    compute, clock, events = Doubler(), Clock(), Events()
    batcher = batcher_of(compute, clock, observer=events)
    compute.gates[5] = threading.Event()
    compute.started[5] = threading.Event()
    lone = asyncio.create_task(batcher.submit([5], priority=1))
    await until(lambda: batcher.busy_workers == 1)
    assert batcher.depth == 0  # never queued: the worker took it on arrival
    # A second request finds the worker busy and waits in the queue, then goes next.
    second = asyncio.create_task(batcher.submit([6], priority=3))
    await until(lambda: batcher.depth == 1)
    compute.release(5)
    assert (await lone).results == [10] and (await second).results == [12]
    assert compute.calls == [[5], [6]]
    assert events.heard == [("computed", 1, None), ("waited", 0, None),
                            ("computed", 1, None), ("waited", 2, None)]
    await batcher.close()


async def test_a_lone_request_in_compute_is_answered_at_its_deadline_and_the_worker_freed(
) -> None:
    compute, clock, events = Doubler(), Clock(), Events()
    batcher = batcher_of(compute, clock, observer=events, levels=1, default_priority=1)
    held = await compute.hold(batcher)  # a lone request: taken by the worker on arrival
    # One that waits in the queue past its deadline: dropped there, counted "expired".
    with pytest.raises(DeadlineExpired, match="deadline of 20 ms passed"):
        await asyncio.wait_for(batcher.submit([7], timeout_s=0.02), timeout=5)
    compute.release()
    await held
    # A lone request whose deadline passes while it computes: answered at its deadline by
    # its timer, not when the worker is done; nothing was dropped from the queue for it.
    compute.gates[9] = threading.Event()
    compute.started[9] = threading.Event()
    with pytest.raises(DeadlineExpired, match="deadline of 20 ms passed"):
        await asyncio.wait_for(batcher.submit([9], timeout_s=0.02), timeout=5)
    assert batcher.busy_workers == 1  # still computing: its result will be dropped
    compute.release(9)
    await until_s(lambda: batcher.busy_workers == 0)  # the worker thread's turn
    assert (await batcher.submit([11])).results == [22]  # the worker serves the next
    assert [e for e in events.heard if e[0] == "dropped"] == [("dropped", 0, "expired")]
    assert 7 not in compute.computed and 9 in compute.computed
    await batcher.close()


async def test_a_cancelled_lone_request_frees_nothing_twice() -> None:
    compute, clock = Doubler(), Clock()
    batcher = batcher_of(compute, clock)
    compute.gates[5] = threading.Event()
    compute.started[5] = threading.Event()
    lone = asyncio.create_task(batcher.submit([5]))
    assert await asyncio.to_thread(compute.started[5].wait, 5)
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    compute.release(5)
    await until_s(lambda: batcher.busy_workers == 0)  # the worker thread's turn
    results = await asyncio.gather(batcher.submit([1]), batcher.submit([2]))
    assert [r.results for r in results] == [[2], [4]]
    assert batcher.busy_workers == 0 and batcher.depth == 0
    await batcher.close()


def express_batcher(compute: Doubler, clock: Clock, observer: BatchObserver | None = None
                    ) -> DynamicBatcher[int, int]:
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        compute, max_batch_size=4, size_of=lambda _: 10, clock=clock, cost=FixedCost(),
        express=True, observer=observer, policy=SchedulePolicy.uniform(
            levels=3, max_queue_size=64, default_timeout_s=60.0, default_priority=2))
    batcher.start()
    return batcher


async def held_on(compute: Doubler, batcher: DynamicBatcher[int, int], item: int, *,
                  key: str, priority: int = 0, express: bool = False) -> asyncio.Task[object]:
    """A regular worker busy with ``item`` of ``key`` until ``compute.release(item)``."""
    compute.gates[item] = threading.Event()
    compute.started[item] = threading.Event()
    task: asyncio.Task[object] = asyncio.create_task(
        batcher.submit([item], key=key, priority=priority, express=express))
    assert await asyncio.to_thread(compute.started[item].wait, 5)
    return task


async def test_the_express_lane_computes_a_quiet_key_beside_a_floods_batch() -> None:
    compute, clock, events = Doubler(), Clock(), Events()
    batcher = express_batcher(compute, clock, events)
    held = await held_on(compute, batcher, 1000, key="A")
    flood = [asyncio.create_task(batcher.submit([i], key="A")) for i in range(1, 9)]
    await until(lambda: batcher.depth == 8)
    assert batcher.busy_workers == 1  # A's own backlog waits for the regular worker
    # B's request is answered while A's batch is still in compute, and takes none of A's.
    assert (await batcher.submit([500], key="B", express=True)).results == [1000]
    assert compute.calls == [[1000], [500]]
    assert batcher.depth == 8
    assert [e for e in events.heard if e[0] == "express"] == [("express", 1, None)]
    compute.release(1000)
    await asyncio.gather(held, *flood)
    assert sorted(compute.computed) == [*range(1, 9), 500, 1000]
    await batcher.close()


async def test_the_express_lane_leaves_a_request_its_caller_did_not_judge_quiet() -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A")
    # B was served less than A lately, but its gateway had a backlog of B's calls (two tenants
    # evenly busy): it waits for the regular worker instead of computing alone beside A's.
    busy = asyncio.create_task(batcher.submit([500], key="B"))
    await until(lambda: batcher.depth == 1)
    assert batcher.busy_workers == 1 and compute.calls == [[1000]]
    # A request judged quiet, of a third key, still takes the lane past B's in the queue.
    assert (await batcher.submit([600], key="C", express=True)).results == [1200]
    assert compute.calls == [[1000], [600]] and batcher.depth == 1
    compute.release(1000)
    assert (await busy).results == [1000]
    await held
    await batcher.close()


async def test_the_express_lane_takes_only_a_key_served_less_lately_than_the_one_in_compute(
) -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A")  # A served 10 tokens
    assert (await batcher.submit([500], key="B", express=True)).results == [1000]  # the lane
    # B has now been served as much as A lately: no longer quiet beside it, so its next
    # request waits for the regular worker instead of always cutting ahead of A's batches.
    second = asyncio.create_task(batcher.submit([501], key="B", express=True))
    await until(lambda: batcher.depth == 1)
    assert batcher.busy_workers == 1 and compute.calls == [[1000], [500]]
    compute.release(1000)
    assert (await second).results == [1002]
    await held
    # Two windows on, what was served is forgotten: behind A's new batch again, B is quiet.
    clock.now += 2.0
    held = await held_on(compute, batcher, 2000, key="A")
    assert (await batcher.submit([502], key="B", express=True)).results == [1004]
    assert compute.calls == [[1000], [500], [501], [2000], [502]]
    compute.release(2000)
    await held
    await batcher.close()


def test_recent_service_counts_two_windows_and_leaves_the_keys_not_behind() -> None:
    from backend.scheduling.served import RecentService

    clock = Clock()
    served = RecentService(clock, window_s=1.0)
    served.add("A", 10)
    clock.now += 0.5
    served.add("B", 4)
    assert served.not_behind(frozenset({"A"})) == {"A"}  # B (4) is behind A (10)
    served.add("B", 6)
    assert served.not_behind(frozenset({"A"})) == {"A", "B"}  # a tie is not behind
    clock.now += 0.6  # the next window: the first one still counts
    assert (served.of("A"), served.of("B")) == (10, 10)
    served.add("C", 1)
    clock.now += 1.0  # A and B's window is two back now
    assert (served.of("A"), served.of("B"), served.of("C")) == (0, 0, 1)
    assert served.not_behind(frozenset({"A"})) == {"A", "C"}
    clock.now += 5.0
    assert served.of("C") == 0 and served.not_behind(frozenset()) == frozenset()


async def test_the_express_lane_leaves_a_key_in_compute_and_lower_levels_to_the_queue(
) -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A")  # level 2
    same_key = asyncio.create_task(batcher.submit([1], key="A"))
    lower = asyncio.create_task(batcher.submit([2], key="C", priority=3))
    await until(lambda: batcher.depth == 2)
    # The lane's choice is made inside submit, on the loop: had it taken either, the queue
    # would hold one and two workers would be busy.
    assert batcher.busy_workers == 1 and compute.calls == [[1000]]
    compute.release(1000)
    await asyncio.gather(held, same_key, lower)
    assert compute.calls[1:] == [[1, 2]]
    await batcher.close()


async def test_the_express_lane_takes_a_better_level_even_from_the_key_in_compute() -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A", priority=3)  # a batch line
    assert (await batcher.submit([7], key="A", priority=1)).results == [14]
    assert compute.calls == [[1000], [7]]
    compute.release(1000)
    await held
    await batcher.close()


async def test_the_express_lane_is_one_worker_counted_busy_and_waited_for_on_close() -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A")
    quiet = await held_on(compute, batcher, 2000, key="B", express=True)
    assert batcher.busy_workers == 2
    # Both busy: a third key waits for whichever frees first (here the lane).
    third = asyncio.create_task(batcher.submit([3], key="C", express=True))
    await until(lambda: batcher.depth == 1)
    compute.release(2000)
    await asyncio.gather(quiet, third)
    assert compute.calls == [[1000], [2000], [3]]
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.01)
    assert not closing.done()  # A's batch still computes
    compute.release(1000)
    await asyncio.gather(held, closing)
    assert batcher.busy_workers == 0


class Priorities(Doubler):
    """Records the nice value of the thread each call runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.nice: dict[int, int] = {}

    def __call__(self, items: list[int]) -> list[int]:
        for item in items:
            self.nice[item] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return super().__call__(items)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
async def test_regular_workers_run_nice_steps_below_the_loop_and_the_express_lane() -> None:
    compute, clock = Priorities(), Clock()
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        compute, max_batch_size=4, size_of=lambda _: 10, clock=clock, cost=FixedCost(),
        express=True, nice=3, nice_hold_s=1.0, policy=SchedulePolicy.uniform(
            levels=3, max_queue_size=64, default_timeout_s=60.0, default_priority=2))
    batcher.start()
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    niced = min(19, base + 3)
    # The lane has not been used: a lone key's batch keeps the loop's priority.
    held = await held_on(compute, batcher, 1000, key="A")
    # B's request takes the lane, at the loop's priority, beside A's batch.
    assert (await batcher.submit([5], key="B", express=True)).results == [10]
    follow = asyncio.create_task(batcher.submit([6], key="A"))
    await until(lambda: batcher.depth == 1)
    compute.release(1000)
    await asyncio.gather(held, follow)
    # While the lane is in use (its last batch began within the hold), regular batches yield.
    clock.now += 1.0
    assert (await batcher.submit([7], key="A")).results == [14]
    # Past the hold, a regular batch is back at the loop's priority.
    clock.now += 0.01
    assert (await batcher.submit([8], key="A")).results == [16]
    assert compute.nice == {1000: base, 5: base, 6: niced, 7: niced, 8: base}
    await batcher.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
async def test_without_the_express_lane_the_nice_steps_always_hold() -> None:
    compute, clock = Priorities(), Clock()
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        compute, max_batch_size=4, size_of=lambda _: 10, clock=clock, cost=FixedCost(),
        nice=3)
    batcher.start()
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert (await batcher.submit([1], key="A")).results == [2]
    assert compute.nice == {1: min(19, base + 3)}
    await batcher.close()


def test_the_express_lane_and_the_nice_steps_are_off_unless_set() -> None:
    from backend.settings import ServeSettings

    shipped = ServeSettings.from_env(environ={})
    assert (shipped.express_lane, shipped.compute_nice) == (False, 0)
    given = ServeSettings.from_env(environ={"BACKEND_EXPRESS_LANE": "1",
                                            "BACKEND_COMPUTE_NICE": "5"})
    assert (given.express_lane, given.compute_nice) == (True, 5)
    with pytest.raises(ValueError, match="compute_nice"):
        ServeSettings.from_env(environ={"BACKEND_COMPUTE_NICE": "20"})


async def test_a_compute_error_in_the_express_lane_reaches_its_callers_and_frees_the_lane(
) -> None:
    compute, clock = Doubler(), Clock()
    batcher = express_batcher(compute, clock)
    held = await held_on(compute, batcher, 1000, key="A")
    compute.fail_on = 13
    with pytest.raises(ValueError, match="poisoned"):
        await batcher.submit([13], key="B", express=True)
    assert batcher.busy_workers == 1  # the lane is free again: the next quiet call takes it
    compute.fail_on = None
    assert (await batcher.submit([4], key="C", express=True)).results == [8]
    assert compute.calls == [[1000], [13], [4]]
    compute.release(1000)
    await held
    await batcher.close()
