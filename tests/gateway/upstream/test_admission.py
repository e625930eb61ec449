"""Admission: per-tier concurrency, bounded FIFO queue, shedding at once, deadlines in the queue."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import DeadlineExceeded, Overloaded
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.admission.slots import Slot

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default


def make(concurrency: int = 1, queue: int = 2,
         wait_factor: float = 0.0) -> tuple[Admission, CollectorRegistry]:
    """A fixed limit; no wait bound unless ``wait_factor`` (tests of the queue's mechanics)."""
    registry = CollectorRegistry()
    admission = Admission(AdmissionSettings(tier_concurrency=concurrency, tier_queue=queue,
                                            adaptive=FIXED, max_wait_factor=wait_factor),
                          observer=MetricsObserver(GatewayMetrics(registry)))
    return admission, registry


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tier_concurrency": 0}, "tier_concurrency"),
    ({"tier_queue": -1}, "tier_queue"),
    ({"tier_concurrency": 1.5}, "tier_concurrency"),
])
def test_settings_reject_bad_values_naming_the_field(kwargs: dict[str, object],
                                                     field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        AdmissionSettings(**kwargs)  # type: ignore[arg-type]


def later(seconds: float) -> float:
    return time.monotonic() + seconds


def shed(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("gateway_shed_total", {"reason": reason}) or 0.0


async def test_slots_up_to_the_limit_then_fifo_queue() -> None:
    admission, registry = make(concurrency=2, queue=5)
    first = await admission.acquire("zone", deadline=later(5))
    second = await admission.acquire("zone", deadline=later(5))
    assert not first.waited and admission.inflight("zone") == 2
    assert registry.get_sample_value("gateway_upstream_inflight", {"tier": "zone"}) == 2
    order: list[int] = []

    async def wait(i: int) -> Slot:
        slot = await admission.acquire("zone", deadline=later(5))
        order.append(i)
        return slot

    waiters = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert admission.queue_depth("zone") == 3
    assert registry.get_sample_value("gateway_queue_depth",
                                     {"tier": "zone", "class": "interactive"}) == 3
    assert admission.inflight("region") == 0  # tiers are independent
    first.release()
    first.release()  # idempotent
    second.release()
    await asyncio.sleep(0.01)
    assert order == [0, 1]
    slots = [w.result() for w in waiters if w.done()]
    assert all(s.waited for s in slots)
    for slot in slots:
        async with slot:
            pass
    await asyncio.sleep(0.01)
    assert order == [0, 1, 2]
    waiters[2].result().release()
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_full_queue_sheds_at_once_with_retry_after_and_stays_bounded() -> None:
    admission, registry = make(concurrency=1, queue=10)
    held = await admission.acquire("zone", deadline=later(5))
    admission.observe(0.5, tier="zone")
    results: list[BaseException | Slot] = []

    async def attempt() -> None:
        try:
            results.append(await admission.acquire("zone", deadline=later(60)))
        except Overloaded as exc:
            results.append(exc)

    tasks = [asyncio.create_task(attempt()) for _ in range(500)]
    await asyncio.sleep(0.05)
    assert admission.queue_depth("zone") == 10  # never more than its limit
    refused = [r for r in results if isinstance(r, Overloaded)]
    assert len(refused) == 490 and all(r.reason == "queue_full" for r in refused)
    retry_after = int(refused[0].headers()["Retry-After"])
    assert retry_after >= 1
    assert shed(registry, "queue_full") == 490

    shed_now = admission.acquire("zone", deadline=later(60))
    with pytest.raises(Overloaded):  # shed without waiting on anything: raised on the first step
        shed_now.send(None)

    held.release()
    for _ in range(10):
        await asyncio.sleep(0.01)
        for r in list(results):
            if isinstance(r, Slot):
                results.remove(r)
                r.release()
    await asyncio.gather(*tasks)
    assert admission.queue_depth("zone") == 0 and admission.inflight("zone") == 0


async def test_expected_wait_past_the_deadline_sheds_at_once() -> None:
    admission, registry = make(concurrency=1, queue=10)
    held = await admission.acquire("zone", deadline=later(5))
    admission.observe(0.4, tier="zone")  # a slot is held ~0.4 s
    with pytest.raises(Overloaded) as info:
        await admission.acquire("zone", deadline=later(0.2))
    assert info.value.reason == "deadline"
    assert info.value.status == 503 and "Retry-After" in info.value.headers()
    assert shed(registry, "deadline") == 1
    assert admission.check("zone", deadline=later(0.2)) is not None
    assert admission.check("zone", deadline=later(5)) is None  # enough time: it would queue
    queued = asyncio.create_task(admission.acquire("zone", deadline=later(5)))
    await asyncio.sleep(0.01)
    assert admission.queue_depth("zone") == 1
    held.release()
    (await queued).release()


async def test_deadline_passing_in_the_queue_is_a_504_and_leaves_the_queue() -> None:
    admission, registry = make(concurrency=1, queue=10)
    held = await admission.acquire("zone", deadline=later(5))
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await admission.acquire("zone", deadline=later(0.05))
    assert time.monotonic() - start >= 0.04
    assert admission.queue_depth("zone") == 0
    assert shed(registry, "expired") == 1
    held.release()
    assert admission.inflight("zone") == 0  # nobody left to hand the slot to

    with pytest.raises(DeadlineExceeded):  # already past: refused before queueing
        await admission.acquire("zone", deadline=time.monotonic() - 1)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    admission, _ = make(concurrency=1, queue=10)
    held = await admission.acquire("zone", deadline=later(5))
    waiter = asyncio.create_task(admission.acquire("zone", deadline=later(5)))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.queue_depth("zone") == 0
    held.release()
    assert admission.inflight("zone") == 0


async def test_try_acquire_never_queues() -> None:
    admission, _ = make(concurrency=1, queue=10)
    slot = admission.try_acquire("zone")
    assert slot is not None
    assert admission.try_acquire("zone") is None
    slot.release()
    assert admission.try_acquire("zone") is not None


async def test_service_time_ewma_comes_from_released_slots() -> None:
    admission, _ = make()
    assert admission.service_time_s("zone") == 0.0
    slot = await admission.acquire("zone", deadline=later(5))
    await asyncio.sleep(0.02)
    slot.release()
    assert admission.service_time_s("zone") >= 0.015
    admission.observe(1.0)  # no tier: every known tier
    assert admission.service_time_s("zone") > 0.2


async def test_wait_bound_sheds_interactive_surplus_at_once_and_keeps_batch_waiting() -> None:
    """``max_wait_factor``: a newcomer whose expected wait passes that many service times is
    told at once (503, reason "wait"), however long its deadline; batch-class calls queue."""
    admission, registry = make(concurrency=2, queue=100, wait_factor=2.0)
    held = [await admission.acquire("zone", deadline=later(60)) for _ in range(2)]
    admission.observe(0.1, tier="zone")  # slots are held ~100 ms: one turn is 50 ms
    waiters = [asyncio.create_task(admission.acquire("zone", deadline=later(60)))
               for _ in range(3)]
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 3  # 4th position: 200 ms, within 2 x 100 ms
    queued = asyncio.create_task(admission.acquire("zone", deadline=later(60)))
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 4
    with pytest.raises(Overloaded) as shed:  # 5th position: 250 ms > 200 ms
        await admission.acquire("zone", deadline=later(60))
    assert shed.value.reason == "wait" and "2 x the tier's service time" in str(shed.value)
    assert int(shed.value.headers()["Retry-After"]) >= 1
    assert registry.get_sample_value("gateway_shed_total", {"reason": "wait"}) == 1
    batch = asyncio.create_task(admission.acquire("zone", deadline=later(60), priority="batch"))
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 5 and not batch.done()  # batch waits its turn
    for slot in held:
        slot.release()
    for task in [*waiters, queued, batch]:
        slot = await task
        slot.release()
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_wait_bound_sheds_the_tenant_over_its_share_not_the_one_under_it() -> None:
    """A quiet tenant's call that has to queue behind a flooding tenant's backlog is not shed
    by the wait bound while it holds and waits for no more than its share of the limit: the
    fair queue serves it next. Past its share it is bounded like anyone."""
    admission, registry = make(concurrency=4, queue=100, wait_factor=0.2)
    flood = [await admission.acquire("zone", deadline=later(60), tenant="a") for _ in range(4)]
    backlog = [asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="a"))
               for _ in range(2)]  # no service time yet: no bound, they queue
    await asyncio.sleep(0)
    admission.observe(0.1, tier="zone")  # one turn: 100 ms / 4 = 25 ms; the bound is 20 ms
    with pytest.raises(Overloaded) as over:  # a: 4 held + 2 waiting + 1 > its share, 4
        await admission.acquire("zone", deadline=later(60), tenant="a")
    assert over.value.reason == "wait"
    quiet = await admission.acquire("zone", deadline=later(60), tenant="b")  # holds none: now
    # b's next call, with it, holds 2 of the limit's 4: its share beside a. Its own slots do
    # not count against the limit and reserve (a's 4 < 4 + 1): a slot at once, over the limit.
    assert admission.check("zone", deadline=later(60), tenant="b") is None
    second = await admission.acquire("zone", deadline=later(60), tenant="b")
    assert admission.tenants("zone")["b"] == (2, 0) and admission.inflight("zone") == 6
    with pytest.raises(Overloaded) as past:  # a third: 3 of 4 against a share of 2
        await admission.acquire("zone", deadline=later(60), tenant="b")
    assert past.value.reason == "wait"
    # c holds none and is under its share (1 of 4 among three), but a's and b's 6 slots are
    # past the limit and reserve: it queues, and the wait bound (25 ms > 20 ms) does not shed
    # it, as it is under its share; the fair queue serves it first.
    third = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="c"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["c"] == (0, 1)
    assert shed(registry, "wait") == 2
    for slot in flood[:2]:  # 4 held: b's slots over the limit count, nothing is granted
        slot.release()
    await asyncio.sleep(0)
    assert admission.tenants("zone")["c"] == (0, 1)
    flood[2].release()  # 3 held: one free, and c goes before a's backlog
    await asyncio.sleep(0)
    assert admission.tenants("zone")["c"] == (1, 0) and admission.queue_depth("zone") == 2
    for slot in [flood[3], quiet, second]:
        slot.release()
    for task in [*backlog, third]:
        (await task).release()
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_wait_bound_holds_while_the_adaptive_limit_probes() -> None:
    """During a minRTT probe the limit is held low; the expected wait is reckoned at that
    limit, and the wait bound still holds: under overload a probe does not let a queue of
    several hundred milliseconds build (what the bound was off for, the overload run's p99
    of ~800 ms came from)."""
    clock = [0.0]
    admission = Admission(AdmissionSettings(  # a floor of 3 (the default is 2)
        tier_concurrency=64, tier_queue=100, max_wait_factor=1.0,
        adaptive=AdaptiveSettings(min_limit=3)), clock=lambda: clock[0])
    tracker = admission.adaptive("zone")
    assert tracker is not None and tracker.probing and not tracker.min_rtt_s
    # Before the first probe ends the limit is the floor, nothing learned: no bound yet.
    held = [await admission.acquire("zone", deadline=60) for _ in range(3)]  # min_limit
    admission.observe(0.1, tier="zone")
    early = [asyncio.create_task(admission.acquire("zone", deadline=60)) for _ in range(20)]
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 20 and not any(w.done() for w in early)
    for slot in held:
        slot.release()
    for task in early:
        (await task).release()
    for _ in range(100):  # calls of 20 ms each until the first probe ends
        if tracker.min_rtt_s:
            break
        slot = await admission.acquire("zone", deadline=60)
        clock[0] += 0.02
        slot.release()
    assert tracker.min_rtt_s and not tracker.probing
    clock[0] += 60.0  # the next probe is due: the next finished call starts it
    slot = await admission.acquire("zone", deadline=120)
    slot.release()
    assert tracker.probing and tracker.limit == 3
    admission.observe(0.1, tier="zone")
    admission.observe(0.1, tier="zone")
    admission.observe(0.1, tier="zone")
    held = [await admission.acquire("zone", deadline=120) for _ in range(3)]
    # One turn is 100 ms / 3 slots: the first three waiters are within 1 x 100 ms.
    waiters = [asyncio.create_task(admission.acquire("zone", deadline=120))
               for _ in range(3)]
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 3 and not any(w.done() for w in waiters)
    with pytest.raises(Overloaded) as refused:  # the fourth: 133 ms
        await admission.acquire("zone", deadline=120)
    assert refused.value.reason == "wait"
    for slot in held:
        slot.release()
    for task in waiters:
        (await task).release()


async def test_batch_calls_leave_a_quarter_of_the_limit_to_interactive_ones() -> None:
    """Batch-class calls hold at most the limit less a quarter (at least one slot): an
    interactive call arriving while batch work fills the tier gets a slot at once."""
    admission, _ = make(concurrency=4, queue=100)
    batch = [await asyncio.wait_for(admission.acquire("zone", deadline=later(60),
                                                      priority="batch"), 1) for _ in range(3)]
    fourth = asyncio.create_task(admission.acquire("zone", deadline=later(60), priority="batch"))
    await asyncio.sleep(0)
    assert not fourth.done() and admission.inflight("zone") == 3  # the 4th slot is kept
    interactive = await asyncio.wait_for(admission.acquire("zone", deadline=later(60)), 1)
    assert admission.inflight("zone") == 4 and not interactive.waited
    interactive.release()  # the freed slot is the interactive one: batch stays at its share
    await asyncio.sleep(0)
    assert not fourth.done()
    batch[0].release()  # a batch slot freed: the waiting batch call takes it
    slot = await asyncio.wait_for(fourth, 1)
    assert slot.batch and slot.waited
    for s in [*batch[1:], slot]:
        s.release()
    assert admission.inflight("zone") == 0


async def test_a_limit_of_one_keeps_no_slot_from_batch_calls() -> None:
    admission, _ = make(concurrency=1, queue=10)
    slot = await asyncio.wait_for(admission.acquire("zone", deadline=later(60),
                                                    priority="batch"), 1)
    slot.release()
    assert admission.inflight("zone") == 0


def waits(registry: CollectorRegistry, cls: str, outcome: str) -> tuple[float, float]:
    """(count, sum) of ``gateway_queue_wait_seconds`` for one class and outcome in tier zone."""
    labels = {"tier": "zone", "class": cls, "outcome": outcome}
    return (registry.get_sample_value("gateway_queue_wait_seconds_count", labels) or 0.0,
            registry.get_sample_value("gateway_queue_wait_seconds_sum", labels) or 0.0)


async def test_queue_depth_and_wait_by_class_and_outcome() -> None:
    """The queue's depth per class, and how long each call that queued waited (injected clock):
    granted, or left the queue shed, expired or cancelled; one granted at once is no wait."""
    now = [100.0]
    registry = CollectorRegistry()
    admission = Admission(AdmissionSettings(tier_concurrency=1, tier_queue=3, adaptive=FIXED,
                                            max_wait_factor=0.0),
                          observer=MetricsObserver(GatewayMetrics(registry)),
                          clock=lambda: now[0])

    def depth(cls: str) -> float | None:
        return registry.get_sample_value("gateway_queue_depth", {"tier": "zone", "class": cls})

    def acquire(deadline_s: float, priority: str = "interactive",
                tenant: str = "public") -> asyncio.Task[Slot]:
        return asyncio.create_task(admission.acquire(
            "zone", deadline=now[0] + deadline_s, priority=priority,  # type: ignore[arg-type]
            tenant=tenant))

    held = await admission.acquire("zone", deadline=now[0] + 60)
    assert waits(registry, "interactive", "granted") == (0, 0.0)  # at once: not a wait
    interactive, bulk, hurried = acquire(60), acquire(60, "batch"), acquire(0.05, "batch")
    await asyncio.sleep(0)
    assert (depth("interactive"), depth("batch")) == (1, 2)
    with pytest.raises(DeadlineExceeded):  # 50 ms of the loop's time; the clock stands still
        await hurried
    assert waits(registry, "batch", "expired") == (1, 0.0)
    assert (depth("interactive"), depth("batch")) == (1, 1)
    now[0] += 0.3
    held.release()
    slot = await interactive
    assert slot.queued_s == pytest.approx(0.3)
    assert waits(registry, "interactive", "granted") == (1, pytest.approx(0.3))
    assert (depth("interactive"), depth("batch")) == (0, 1)

    # The queue full (3 waiters), an interactive newcomer sheds the batch waiter.
    now[0] += 0.1
    first, second, third = acquire(60), acquire(60), acquire(60)
    with pytest.raises(Overloaded):
        await bulk
    assert waits(registry, "batch", "shed") == (1, pytest.approx(0.4))
    assert (depth("interactive"), depth("batch")) == (3, 0)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert waits(registry, "interactive", "cancelled") == (1, 0.0)

    slot.release()
    slot = await first
    late = acquire(60, "batch")
    await asyncio.sleep(0)
    assert (depth("interactive"), depth("batch")) == (1, 1)
    now[0] += 0.2
    slot.release()
    (await third).release()
    (await late).release()
    assert waits(registry, "batch", "granted") == (1, pytest.approx(0.2))
    assert waits(registry, "interactive", "granted") == (3, pytest.approx(0.3 + 0.2))
    assert (depth("interactive"), depth("batch")) == (0, 0)
    assert admission.inflight("zone") == 0


@pytest.mark.parametrize("express", [False, True])
async def test_with_express_a_tenant_holding_no_slot_goes_at_once_up_to_the_ceiling(
        express: bool) -> None:
    """While the adaptive limit is low (here its first probe, at the floor of 3), a tenant
    holding no slot queues behind the others' slots past the limit and reserve; with
    ``express`` (a backend whose express lane computes it beside the batch in compute) it
    gets one at once, up to ``tier_concurrency`` and its reserve, and only while it holds
    none."""
    admission = Admission(AdmissionSettings(tier_concurrency=5, tier_queue=100,
                                            max_wait_factor=0.0, express=express,
                                            adaptive=AdaptiveSettings(min_limit=3)))
    flood = [await admission.acquire("zone", deadline=later(60), tenant="a") for _ in range(3)]
    b = await admission.acquire("zone", deadline=later(60), tenant="b")  # 3 < 3 + 1: at once
    c = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="c"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["c"] == ((1, 0) if express else (0, 1))
    if express:
        # c holds one now: its next call takes the ordinary way (past its share) and queues.
        c2 = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="c"))
        await asyncio.sleep(0)
        assert admission.tenants("zone")["c"] == (1, 1)
        (await c).release()
        await asyncio.sleep(0)
        e = await admission.acquire("zone", deadline=later(60), tenant="e")  # 4 in flight
        f = await admission.acquire("zone", deadline=later(60), tenant="f")  # 5
        # d holds none, but 6 are in flight: the ceiling, 5, and its reserve, 1. It queues.
        d = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="d"))
        await asyncio.sleep(0)
        assert admission.inflight("zone") == 6 and admission.tenants("zone")["d"] == (0, 1)
        for slot in [*flood, b, e, f]:
            slot.release()
        for task in (c2, d):
            (await task).release()
    else:
        for slot in [*flood, b]:
            slot.release()
        (await c).release()
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_with_express_a_tenant_already_holding_a_slot_is_not_let_past_the_limit() -> None:
    """The express way is for a tenant holding none: one holding a slot, even under its
    share, keeps the ordinary bound (the others' slots within the limit and reserve)."""
    admission = Admission(AdmissionSettings(
        tier_concurrency=64, tier_queue=100, max_wait_factor=0.0, express=True,
        adaptive=AdaptiveSettings(min_limit=8)))  # the first probe's limit: 8, reserve 2
    held = [await admission.acquire("zone", deadline=later(60), tenant="a") for _ in range(8)]
    held += [await admission.acquire("zone", deadline=later(60), tenant=t) for t in "bcd"]
    # b holds 1 of its share of 2 (8 among a, b, c, d); the others hold 10 = 8 + 2.
    second = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="b"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["b"] == (1, 1)
    assert (await admission.acquire("zone", deadline=later(60), tenant="e")) is not None
    assert admission.inflight("zone") == 12
    second.cancel()
    for slot in held:
        slot.release()


@pytest.mark.parametrize("express", [False, True])
async def test_with_express_a_tenant_quiet_by_its_share_of_the_calls_overlaps_its_calls(
        express: bool) -> None:
    """A flood's slower calls pull the learned limit down (here the first probe's 3, reserve
    1) and with it every tenant's share of slots: a quiet tenant whose calls overlap is over
    its share of slots with its second one. With ``express`` it is judged by its share of the
    tier's calls lately instead (b: 6 of 44, under its half), so its second call goes at
    once, bounded by its share of the ceiling (8); the flood (30 of 35) and a lone tenant
    (all of them) keep the ordinary bound; with no grant for two windows the evidence is gone."""
    now = [100.0]
    admission = Admission(AdmissionSettings(
        tier_concurrency=8, tier_queue=100, max_wait_factor=0.0, express=express,
        adaptive=AdaptiveSettings(min_limit=3)), clock=lambda: now[0])

    async def call(tenant: str) -> None:
        (await admission.acquire("zone", deadline=now[0] + 60, tenant=tenant)).release()

    for _ in range(6):  # a lone tenant: all the calls, never quiet
        await call("a")
    alone = [await admission.acquire("zone", deadline=now[0] + 60, tenant="a")
             for _ in range(3)]
    waits = asyncio.create_task(admission.acquire("zone", deadline=now[0] + 60, tenant="a"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["a"] == (3, 1)
    for slot in alone:
        slot.release()
    (await waits).release()
    now[0] += 0.5
    for _ in range(25):
        await call("a")
    for _ in range(5):
        await call("b")
    flood = [await admission.acquire("zone", deadline=now[0] + 60, tenant="a")
             for _ in range(3)]
    first = await admission.acquire("zone", deadline=now[0] + 60, tenant="b")  # holds none
    second = asyncio.create_task(admission.acquire("zone", deadline=now[0] + 60, tenant="b"))
    more = asyncio.create_task(admission.acquire("zone", deadline=now[0] + 60, tenant="a"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["b"] == ((2, 0) if express else (1, 1))
    assert admission.tenants("zone")["a"] == (3, 1)  # the flood: over its share of the calls
    if express:
        # b's share of the ceiling's 8 is 4: its fifth call in flight waits.
        extra = [await admission.acquire("zone", deadline=now[0] + 60, tenant="b")
                 for _ in range(2)]
        fifth = asyncio.create_task(
            admission.acquire("zone", deadline=now[0] + 60, tenant="b"))
        await asyncio.sleep(0)
        assert admission.tenants("zone")["b"] == (4, 1)
        for slot in [*extra, *flood, first]:
            slot.release()
        for task in (second, fifth, more):
            (await task).release()
    else:
        for slot in [*flood, first]:
            slot.release()
        for task in (second, more):
            (await task).release()
    # Two windows and more without a grant: no evidence, the ordinary bound again.
    now[0] += 2.5
    flood = [await admission.acquire("zone", deadline=now[0] + 60, tenant="a")
             for _ in range(3)]
    first = await admission.acquire("zone", deadline=now[0] + 60, tenant="b")
    second = asyncio.create_task(admission.acquire("zone", deadline=now[0] + 60, tenant="b"))
    await asyncio.sleep(0)
    assert admission.tenants("zone")["b"] == (1, 1)
    for slot in [*flood, first]:
        slot.release()
    (await second).release()
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_with_express_a_call_is_sent_quiet_only_while_its_tenants_last_got_a_slot_at_once(
) -> None:
    """``quiet`` (what the client sends the backend as ``express``): a tenant whose calls
    queue here (a flood, or two tenants evenly busy past the limit) is not, until a call of
    its gets a slot at once again; batch-class calls never are; without ``express``, nobody."""
    from gateway.upstream.admission.fairqueue import BATCH

    off = Admission(AdmissionSettings(tier_concurrency=1, tier_queue=10, adaptive=FIXED))
    assert not off.quiet("a")
    admission = Admission(AdmissionSettings(tier_concurrency=1, tier_queue=10, express=True,
                                            max_wait_factor=0.0, adaptive=FIXED),
                          share=lambda t: (1.0, BATCH if t == "bulk" else "interactive"))
    assert admission.quiet("a") and admission.quiet("b")
    assert not admission.quiet("a", BATCH) and not admission.quiet("bulk")
    first = await admission.acquire("zone", deadline=later(60), tenant="a")  # at once
    assert admission.quiet("a")
    second = asyncio.create_task(admission.acquire("zone", deadline=later(60), tenant="a"))
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 1
    assert not admission.quiet("a") and admission.quiet("b")  # a's backlog, not b's
    first.release()
    (await second).release()
    assert not admission.quiet("a")  # its last call had to queue
    (await admission.acquire("zone", deadline=later(60), tenant="a")).release()  # at once
    assert admission.quiet("a")
