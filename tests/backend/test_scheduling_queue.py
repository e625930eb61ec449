"""The scheduled queue (pure): priority order, fairness between keys, victims, expiry and the
compute bound, with the time passed in and a cost model taught by hand."""

from __future__ import annotations

import pytest

from backend.scheduling.cost import CostModel
from backend.scheduling.policy import SchedulePolicy
from backend.scheduling.queue import ScheduleQueue, Ticket


def make_queue(levels: int = 3, budget_s: float = 0.0, fair_by: str = "tokens"
               ) -> ScheduleQueue:
    return ScheduleQueue(SchedulePolicy.uniform(
        levels=levels, max_queue_size=100, default_timeout_s=10.0,
        max_batch_compute_s=budget_s, fair_by=fair_by))


class Feed:
    """Pushes requests of (name, size) items; names come back from ``take``."""

    def __init__(self, queue: ScheduleQueue) -> None:
        self.queue = queue
        self.seq = 0

    def push(self, *names: str, key: str = "", level: int = 0, size: int = 10,
             deadline: float = 100.0, now: float = 0.0, express: bool = False) -> Ticket:
        self.seq += 1
        req = Ticket(len(names), level=level, key=key, deadline=deadline, enqueued=now,
                     seq=self.seq, express=express)
        self.queue.push(req, list(names), lambda _: size)
        return req


def taught(per_token_s: float) -> CostModel:
    cost = CostModel()
    for tokens in (10, 20):  # two sizes: the fit finds no overhead
        cost.observe(tokens, tokens * per_token_s)
    return cost


def names(batch: list) -> list[str]:  # type: ignore[type-arg]
    return [slot.item for slot in batch]


def test_higher_priority_goes_first_and_lower_fills_the_room() -> None:
    queue = make_queue()
    feed = Feed(queue)
    feed.push("low1", "low2", level=2)
    feed.push("mid", level=1)
    feed.push("high", level=0)
    batch, dropped = queue.take(0.0, 3, CostModel())
    assert names(batch) == ["high", "mid", "low1"] and not dropped
    assert names(queue.take(0.0, 3, CostModel())[0]) == ["low2"]


def test_a_flooding_key_does_not_delay_a_quiet_one_behind_its_whole_backlog() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push(*(f"a{i}" for i in range(20)), key="A")
    feed.push("b0", key="B")
    feed.push("b1", key="B")
    first = names(queue.take(0.0, 4, CostModel())[0])
    # B came after all 20 of A's but is served in the first batch, alternating with A (and
    # first: level with A's count, it has less waiting).
    assert first == ["b0", "a0", "b1", "a1"]


def test_a_quiet_key_level_with_a_flood_goes_before_the_floods_next_item() -> None:
    # Batches of one, as short texts on a CPU have them: the flood A keeps items waiting, the
    # quiet B arrives while one of A's computes and is lifted to A's count. The tie goes to
    # the key with fewer tokens waiting, so B's item is the next batch, not the one after.
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push(*(f"a{i}" for i in range(6)), key="A")
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["a0"]  # computing; A counted 10
    feed.push("b0", key="B")  # lifted to 10: level with A, 10 tokens waiting against 50
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["b0"]
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["a1"]
    # The other way round: B waits level with A's count, and A's queue empties and refills
    # (its items all taken): the refilled flood has more waiting, so B still goes first.
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push("a0", key="A")
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["a0"]  # A's queue is empty
    feed.push("b0", key="B")  # alone: count 0
    feed.push("a1", "a2", "a3", key="A")  # returns, lifted to B's 0: level, more waiting
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["b0"]
    # Equal counts and equal tokens waiting: the older item.
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push("c0", key="C")
    feed.push("d0", key="D")
    assert names(queue.take(0.0, 2, CostModel())[0]) == ["c0", "d0"]


def test_fairness_counts_tokens_not_requests() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push("long1", "long2", key="L", size=100)
    for i in range(6):
        feed.push(f"s{i}", key="S", size=20)
    order = []
    while queue.depth:
        order += names(queue.take(0.0, 1, CostModel())[0])
    # S first (level at 0, less waiting); after one long text (100 tokens) S gets about
    # 100 tokens' worth before L's next.
    assert order == ["s0", "long1", "s1", "s2", "s3", "s4", "s5", "long2"]


def test_fairness_by_texts_alternates_whatever_the_lengths() -> None:
    queue = make_queue(levels=1, fair_by="texts")
    feed = Feed(queue)
    feed.push("long1", "long2", key="L", size=100)
    feed.push("s0", "s1", key="S", size=20)
    order = []
    while queue.depth:
        order += names(queue.take(0.0, 1, CostModel())[0])
    assert order == ["s0", "long1", "s1", "long2"]  # ties to the key with less waiting


def test_a_key_that_was_idle_earns_no_credit() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push(*(f"a{i}" for i in range(4)), key="A")
    feed.push("b0", key="B")
    assert names(queue.take(0.0, 3, CostModel())[0]) == ["b0", "a0", "a1"]
    # B returns after its queue emptied: it starts level with A, not ahead by what A used.
    feed.push("b1", "b2", "b3", key="B")
    order = []
    while queue.depth:
        order += names(queue.take(0.0, 1, CostModel())[0])
    assert order[:4] in (["a2", "b1", "a3", "b2"], ["b1", "a2", "b2", "a3"])


def test_expired_requests_leave_with_their_unsent_items_only() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    soon = feed.push("x1", "x2", "x3", deadline=5.0)
    later = feed.push("y", deadline=50.0)
    assert names(queue.take(0.0, 1, CostModel())[0]) == ["x1"]
    assert queue.expired(4.9) == []
    assert queue.expired(5.0) == [soon]
    assert queue.depth == 1 and queue.tokens == 10
    assert names(queue.take(5.0, 4, CostModel())[0]) == ["y"]
    assert queue.expired(60.0) == [] and not later.queued


def test_a_request_that_cannot_finish_even_alone_is_dropped_before_compute() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    hopeless = feed.push("big", size=100, deadline=0.05)  # 100 tokens at 1 ms: 100 ms
    fine = feed.push("small", size=10, deadline=1.0)
    batch, dropped = queue.take(0.0, 4, taught(0.001))
    assert names(batch) == ["small"] and dropped == [hopeless]
    assert hopeless.closed and not fine.closed and queue.depth == 0


def test_a_batch_stops_before_the_item_that_would_carry_it_past_the_tightest_deadline() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    feed.push("tight", size=10, deadline=0.025)  # alone 10 ms; with one more 20, two 30
    feed.push("a", size=10)
    feed.push("b", size=10)
    batch, dropped = queue.take(0.0, 8, taught(0.001))
    assert names(batch) == ["tight", "a"] and not dropped
    assert names(queue.take(0.0, 8, taught(0.001))[0]) == ["b"]


def test_batches_are_bounded_in_expected_compute_but_take_one_item_at_least() -> None:
    queue = make_queue(levels=1, budget_s=0.035)
    feed = Feed(queue)
    feed.push(*(f"i{i}" for i in range(10)), size=10)
    assert len(queue.take(0.0, 32, taught(0.001))[0]) == 3  # 3 x 10 ms <= 35 ms
    feed.push("huge", key="H", size=1000)
    sizes = []
    while queue.depth:
        sizes.append(len(queue.take(0.0, 32, taught(0.001))[0]))
    assert 1 in sizes and sum(sizes) == 8


def test_a_batch_starting_at_a_level_takes_that_levels_compute_bound() -> None:
    """Per level bounds (issue 23): a batch of the lowest level's items alone stops at that
    level's short bound; one that starts at a higher level is bounded by that level's, and
    the lowest level's items fill its room."""
    queue = ScheduleQueue(SchedulePolicy.uniform(
        levels=3, max_queue_size=100, default_timeout_s=10.0, max_batch_compute_s=0.035,
        batch_compute_s=[0.035, 0.035, 0.015]))
    feed = Feed(queue)
    feed.push(*(f"low{i}" for i in range(10)), level=2, size=10)
    assert names(queue.take(0.0, 32, taught(0.001))[0]) == ["low0"]  # 2 x 10 ms > 15 ms
    feed.push("high", level=0, size=10)
    assert names(queue.take(0.0, 32, taught(0.001))[0]) == ["high", "low1", "low2"]
    assert queue.policy.budget_of(2) == 0.015 and queue.policy.budget_of(0) == 0.035


def test_per_level_bounds_default_to_the_policy_bound_and_reject_negatives() -> None:
    policy = SchedulePolicy.uniform(levels=2, max_queue_size=10, default_timeout_s=1.0,
                                    max_batch_compute_s=0.01)
    assert [policy.budget_of(i) for i in range(2)] == [0.01, 0.01]
    short = SchedulePolicy.uniform(levels=3, max_queue_size=10, default_timeout_s=1.0,
                                   batch_compute_s=[0.02, 0.0])  # a short list repeats its last
    assert [short.budget_of(i) for i in range(3)] == [0.02, 0.0, 0.0]
    with pytest.raises(ValueError, match="max_batch_compute"):
        SchedulePolicy.uniform(levels=1, max_queue_size=10, default_timeout_s=1.0,
                               batch_compute_s=[-1.0])


def test_tokens_ahead_counts_higher_levels_and_a_fair_share_of_its_own() -> None:
    queue = make_queue()
    feed = Feed(queue)
    feed.push(*(f"a{i}" for i in range(50)), key="A", level=1)  # 500 tokens
    feed.push("h", level=0, size=30)
    feed.push("low", level=2, size=999)
    # A new 10-token request from B at level 1: all of level 0, A's share up to B's 10, its own.
    assert queue.tokens_ahead(1, "B", 10) == 30 + 10 + 10
    assert queue.tokens_ahead(1, "A", 10) == 30 + 510


def test_removed_requests_are_skipped_and_counted_out_at_once() -> None:
    queue = make_queue(levels=1)
    feed = Feed(queue)
    gone = feed.push("g1", "g2", key="A")
    feed.push("k", key="B")
    queue.remove(gone)
    assert queue.depth == 1 and queue.tokens == 10
    assert names(queue.take(0.0, 4, CostModel())[0]) == ["k"]
    assert queue.drain() == [] and queue.depth == 0


def test_priorities_map_like_tritons() -> None:
    policy = SchedulePolicy.uniform(levels=3, max_queue_size=4, default_timeout_s=1.0,
                                    default_priority=2)
    assert [policy.level_of(p) for p in (0, 1, 2, 3, 9)] == [1, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="priority must be >= 0"):
        policy.level_of(-1)


def test_the_cost_model_learns_overhead_and_per_token_cost() -> None:
    cost = CostModel()
    assert not cost.learned and cost.estimate(100) == 0.0
    for tokens in (10, 100, 10, 100, 50):
        cost.observe(tokens, 0.002 + 0.0001 * tokens)
    assert cost.overhead_s == pytest.approx(0.002, rel=1e-3)
    assert cost.per_token_s == pytest.approx(0.0001, rel=1e-3)
    assert cost.estimate(200, calls=2) == pytest.approx(0.024, rel=1e-3)


def test_one_call_size_alone_splits_its_cost_between_call_and_tokens() -> None:
    cost = CostModel()
    cost.observe(10, 0.004)
    # Not all per token: a batch twice as large is expected to cost 1.5x, not 2x, so the
    # compute bound lets batches grow and show what they really cost.
    assert cost.estimate(20) == pytest.approx(0.006)


def test_the_backend_keeps_the_lowest_levels_batches_short_on_the_cpu() -> None:
    """``schedule_policy`` as shipped: on the CPU every level is bounded at 10 ms but the
    lowest (batch jobs), at 3 ms; on a GPU nothing is bounded; a setting (environment or flag)
    gives every level its own."""
    from backend.dataplane import schedule_policy
    from backend.settings import ServeSettings

    cpu = schedule_policy(ServeSettings.from_env(environ={}), 0.0, 100, on_cpu=True)
    assert [cpu.budget_of(i) for i in range(3)] == [0.010, 0.010, 0.003]
    gpu = schedule_policy(ServeSettings.from_env(environ={}), 0.0, 100, on_cpu=False)
    assert [gpu.budget_of(i) for i in range(3)] == [0.0, 0.0, 0.0]
    given = ServeSettings.from_env(environ={"BACKEND_PRIORITY_BATCH_COMPUTE_MS": "20,5"})
    assert given.priority_batch_compute_ms == (20.0, 5.0)
    policy = schedule_policy(given, 0.0, 100, on_cpu=True)
    assert [policy.budget_of(i) for i in range(3)] == [0.020, 0.005, 0.005]
    one_level = ServeSettings.from_env(environ={"BACKEND_PRIORITY_LEVELS": "1",
                                                "BACKEND_DEFAULT_PRIORITY": "1"})
    assert schedule_policy(one_level, 0.0, 100, on_cpu=True).budget_of(0) == 0.010
    with pytest.raises(ValueError, match="priority_batch_compute_ms"):
        ServeSettings.from_env(environ={"BACKEND_PRIORITY_BATCH_COMPUTE_MS": "-1"})


def test_depth_follows_every_push_take_removal_and_expiry() -> None:
    import random

    rng = random.Random(7)
    queue = make_queue()
    feed = Feed(queue)
    live: list[Ticket] = []
    cost = taught(0.001)
    now = 0.0
    for step in range(2000):
        op = rng.random()
        if op < 0.45:
            items = [f"t{step}.{i}" for i in range(rng.randint(1, 4))]
            live.append(feed.push(*items, key=rng.choice("abc"), level=rng.randint(0, 2),
                                  size=rng.randint(1, 40), deadline=now + rng.uniform(0, 5),
                                  now=now))
        elif op < 0.7:
            queue.take(now, rng.randint(1, 6), cost)
        elif op < 0.85 and live:
            queue.remove(live.pop(rng.randrange(len(live))))
        else:
            now += rng.uniform(0, 0.5)
            queue.expired(now)
        assert queue.depth == sum(level.items for level in queue.levels) >= 0
    while queue.depth:
        queue.take(now, 8, CostModel())
    assert all(level.items == 0 for level in queue.levels)


def test_while_several_keys_send_batches_take_the_shared_bound() -> None:
    """The shared bound (issue 23): with two keys sending in the last second a batch is bounded
    at ``shared_batch_compute_s``; one key alone keeps the level's bound, again once the other
    key has been quiet for the window."""
    queue = ScheduleQueue(SchedulePolicy.uniform(
        levels=1, max_queue_size=100, default_timeout_s=10.0, max_batch_compute_s=0.035,
        shared_batch_compute_s=0.015, active_window_s=1.0))
    feed = Feed(queue)
    feed.push(*(f"a{i}" for i in range(20)), key="A", size=10)
    assert len(queue.take(0.0, 32, taught(0.001))[0]) == 3  # A alone: 3 x 10 ms <= 35 ms
    feed.push("b0", key="B", size=10, now=0.5)
    # Two keys: 15 ms, one item of 10 each (B first: lifted to A's count, less waiting).
    assert names(queue.take(0.5, 32, taught(0.001))[0]) == ["b0"]
    assert names(queue.take(0.55, 32, taught(0.001))[0]) == ["a3"]
    assert len(queue.take(0.6, 32, taught(0.001))[0]) == 1  # B sent 0.1 s ago: still shared
    assert queue.active_keys(1.4) == 1  # A pushed at 0 (forgotten), B at 0.5
    assert len(queue.take(1.6, 32, taught(0.001))[0]) == 3  # both quiet past the window
    assert queue.active_keys(1.6) == 0


def test_without_a_shared_bound_no_key_is_kept() -> None:
    """The keys' last push times are the shared bound's only: off, a stream of distinct keys
    leaves nothing behind."""
    queue = make_queue(levels=1)
    feed = Feed(queue)
    for i in range(100):
        feed.push(f"x{i}", key=f"K{i}")
    assert queue.active_keys(0.0) == 0 and queue._seen is None


def test_the_shared_bound_never_raises_a_levels_shorter_bound() -> None:
    queue = ScheduleQueue(SchedulePolicy.uniform(
        levels=2, max_queue_size=100, default_timeout_s=10.0, max_batch_compute_s=0.035,
        batch_compute_s=[0.035, 0.005], shared_batch_compute_s=0.025))
    feed = Feed(queue)
    feed.push(*(f"low{i}" for i in range(5)), key="A", level=1, size=10)
    feed.push(*(f"o{i}" for i in range(5)), key="B", level=1, size=10)
    assert len(queue.take(0.0, 32, taught(0.001))[0]) == 1  # the level's 5 ms, not 25


def test_the_shared_bound_is_off_unless_set_and_set_by_the_environment() -> None:
    from backend.dataplane import schedule_policy
    from backend.settings import ServeSettings

    shipped = ServeSettings.from_env(environ={})
    for on_cpu in (True, False):
        assert schedule_policy(shipped, 0.0, 100, on_cpu=on_cpu).shared_batch_compute_s == 0.0
    given = ServeSettings.from_env(environ={"BACKEND_SHARED_BATCH_COMPUTE_MS": "5"})
    assert schedule_policy(given, 0.0, 100, on_cpu=True).shared_batch_compute_s == 0.005
    with pytest.raises(ValueError, match="shared_batch_compute_ms"):
        ServeSettings.from_env(environ={"BACKEND_SHARED_BATCH_COMPUTE_MS": "-1"})
    with pytest.raises(ValueError, match="shared_batch_compute"):
        SchedulePolicy.uniform(levels=1, max_queue_size=1, default_timeout_s=1.0,
                               shared_batch_compute_s=-0.001)
    with pytest.raises(ValueError, match="active_window"):
        SchedulePolicy.uniform(levels=1, max_queue_size=1, default_timeout_s=1.0,
                               active_window_s=0.0)


def test_an_express_take_skips_the_keys_in_compute_at_their_level_and_every_lower_level(
) -> None:
    queue = make_queue()
    feed = Feed(queue)
    feed.push("a1", "a2", key="A", level=1, express=True)
    feed.push("b1", key="B", level=1, express=True)
    feed.push("d1", key="D", level=1)  # not judged quiet by its caller
    feed.push("c1", key="C", level=2, express=True)
    feed.push("h1", key="A", level=0)
    # The regular batch in compute starts at level 1 (0-based) and holds key A.
    batch, _ = queue.take(0.0, 8, CostModel(), below=1, exclude=frozenset({"A"}))
    # A's level-0 item (better: no judgement needed), B's; not A's, D's nor C's.
    assert names(batch) == ["h1", "b1"]
    assert queue.depth == 4
    assert queue.take(0.0, 8, CostModel(), below=1, exclude=frozenset({"A"}))[0] == []
    assert names(queue.take(0.0, 8, CostModel())[0]) == ["d1", "a1", "a2", "c1"]  # D: fewer waiting
