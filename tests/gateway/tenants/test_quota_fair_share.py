"""Fair share in admission: the queue's order by priority class and tenant weight, and who is
shed when it is full. The queue alone is a pure data structure; Admission is driven with an
injected clock and slots held by the test itself (the fake holders)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import Overloaded
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, FairQueue, Priority
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.admission.slots import Slot

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default


def drain(queue: FairQueue[str]) -> list[str]:
    out: list[str] = []
    for _ in range(10_000):
        item = queue.pop()
        if item is None:
            return out
        out.append(item)
    raise AssertionError("queue did not drain")


def ones(tenant: str) -> float:
    return 1.0


def test_a_tenant_with_a_backlog_does_not_delay_a_newcomer_by_more_than_a_turn() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(20):
        q.push(f"a{i}", tenant="a", priority=INTERACTIVE, weight=1.0)
    q.push("b0", tenant="b", priority=INTERACTIVE, weight=1.0)
    order = drain(q)
    assert order.index("b0") <= 1  # FIFO would serve it 21st
    assert [x for x in order if x.startswith("a")] == [f"a{i}" for i in range(20)]  # FIFO inside


def test_a_tie_goes_to_the_tenant_holding_fewer_slots() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a0", tenant="a", priority=INTERACTIVE, weight=1.0)
    q.push("b0", tenant="b", priority=INTERACTIVE, weight=1.0)  # the same tag as a0
    assert q.pop({"a": 4}) == "b0"
    q.push("b1", tenant="b", priority=INTERACTIVE, weight=1.0)
    assert q.pop({"a": 4, "b": 1}) == "a0"  # b1's tag is later: no tie
    assert drain(q) == ["b1"]


def test_backlogged_tenants_share_in_proportion_to_their_weights() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(60):
        q.push(f"a{i}", tenant="a", priority=INTERACTIVE, weight=2.0)
        q.push(f"b{i}", tenant="b", priority=INTERACTIVE, weight=1.0)
    first = Counter(x[0] for x in drain(q)[:30])
    assert first == {"a": 20, "b": 10}


def test_interactive_waiters_go_before_batch_ones() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("batch0", tenant="a", priority=BATCH, weight=1.0)
    q.push("int0", tenant="b", priority=INTERACTIVE, weight=1.0)
    q.push("batch1", tenant="b", priority=BATCH, weight=1.0)
    q.push("int1", tenant="a", priority=INTERACTIVE, weight=1.0)
    assert drain(q) == ["int0", "int1", "batch0", "batch1"]
    assert len(q) == 0 and not q


def test_the_victim_is_the_newest_waiter_of_the_tenant_furthest_over_its_share() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push(f"a{i}", tenant="a", priority=INTERACTIVE, weight=1.0)
    q.push("c0", tenant="c", priority=INTERACTIVE, weight=1.0)
    assert q.victim(tenant="b", priority=INTERACTIVE, weight_of=ones, usage={}) == "a2"
    # The flooding tenant itself is shed as the newcomer: nobody is further over than it.
    assert q.victim(tenant="a", priority=INTERACTIVE, weight_of=ones, usage={}) is None
    # Slots held count towards the share: c holds 5, so c is the one furthest over.
    assert q.victim(tenant="b", priority=INTERACTIVE, weight_of=ones, usage={"c": 5}) == "c0"
    # A heavier weight is a larger share: a (weight 4, 2 held + 1 waiting) is under c (1 + 1).
    q2: FairQueue[str] = FairQueue()
    q2.push("a0", tenant="a", priority=INTERACTIVE, weight=4.0)
    q2.push("c0", tenant="c", priority=INTERACTIVE, weight=1.0)
    weights = {"a": 4.0}.get

    def four(tenant: str) -> float:
        return weights(tenant, 1.0)

    assert q2.victim(tenant="b", priority=INTERACTIVE, weight_of=four,
                     usage={"a": 2, "c": 1}) == "c0"
    assert q2.victim(tenant="b", priority=INTERACTIVE, weight_of=four, usage={"a": 8}) == "a0"
    # Equal standing: the newcomer is shed (no swapping one tenant's waiter for another's).
    q3: FairQueue[str] = FairQueue()
    q3.push("a0", tenant="a", priority=INTERACTIVE, weight=1.0)
    assert q3.victim(tenant="b", priority=INTERACTIVE, weight_of=ones, usage={}) is None
    victim = q.victim(tenant="b", priority=INTERACTIVE, weight_of=ones, usage={})
    assert victim is not None and q.remove(victim) and not q.remove(victim)  # by identity
    assert len(q) == 3 and q.queued() == {"a": 2, "c": 1}


def test_batch_waiters_make_room_for_interactive_ones_never_the_reverse() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("int0", tenant="a", priority=INTERACTIVE, weight=1.0)
    q.push("batch0", tenant="b", priority=BATCH, weight=1.0)
    assert q.victim(tenant="a", priority=INTERACTIVE, weight_of=ones, usage={}) == "batch0"
    assert q.victim(tenant="c", priority=BATCH, weight_of=ones, usage={}) is None


def test_ahead_counts_the_waiters_served_first() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(10):
        q.push(f"a{i}", tenant="a", priority=INTERACTIVE, weight=1.0)
    q.push("x", tenant="b", priority=BATCH, weight=1.0)
    assert q.ahead(tenant="b", priority=INTERACTIVE, weight=1.0) == 1
    assert q.ahead(tenant="a", priority=INTERACTIVE, weight=1.0) == 10
    assert q.ahead(tenant="c", priority=BATCH, weight=1.0) == 11


class FakeClock:
    """Admission's clock: moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(concurrency: int = 1, queue: int = 3,
         shares: dict[str, tuple[float, Priority]] | None = None, wait_factor: float = 0.0,
         ) -> tuple[Admission, FakeClock, CollectorRegistry]:
    clock = FakeClock()
    table = shares if shares is not None else {}
    registry = CollectorRegistry()
    admission = Admission(AdmissionSettings(tier_concurrency=concurrency, tier_queue=queue,
                                            adaptive=FIXED, max_wait_factor=wait_factor),
                          observer=MetricsObserver(GatewayMetrics(registry)), clock=clock,
                          share=lambda t: table.get(t, (1.0, INTERACTIVE)))
    return admission, clock, registry


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_flooding_tenant_is_shed_first_and_the_quiet_one_is_served_next() -> None:
    admission, clock, registry = make(concurrency=1, queue=3)
    holder = await admission.acquire("zone", deadline=clock.now + 60, tenant="a")  # fake holder
    got: list[str] = []
    errors: dict[str, Overloaded] = {}

    async def ask(name: str, tenant: str) -> None:
        try:
            slot = await admission.acquire("zone", deadline=clock.now + 60, tenant=tenant)
        except Overloaded as exc:
            errors[name] = exc
            return
        got.append(name)
        slot.release()

    flood = [asyncio.create_task(ask(f"a{i}", "a")) for i in range(5)]
    await settle()
    assert admission.queue_depth("zone") == 3
    assert {k: e.reason for k, e in errors.items()} == {"a3": "queue_full", "a4": "queue_full"}
    quiet = asyncio.create_task(ask("b0", "b"))
    await settle()
    # b's arrival shed a's newest waiter (a furthest over its share), not b.
    assert errors["a2"].reason == "fair_share" and "b0" not in errors
    assert admission.tenants("zone") == {"a": (1, 2), "b": (0, 1)}
    assert registry.get_sample_value("gateway_shed_total", {"reason": "fair_share"}) == 1
    holder.release()
    await asyncio.gather(*flood, quiet)
    assert got.index("b0") <= 1  # within one turn of the flooding tenant
    assert admission.inflight("zone") == 0 and admission.queue_depth("zone") == 0


async def test_deadline_shedding_uses_the_fair_position_not_the_queue_length() -> None:
    admission, clock, _ = make(concurrency=1, queue=50)
    holder = await admission.acquire("zone", deadline=clock.now + 60, tenant="a")
    admission.observe(0.1, tier="zone")  # a slot is held ~100 ms
    waiters = [asyncio.create_task(admission.acquire("zone", deadline=clock.now + 60,
                                                     tenant="a")) for _ in range(20)]
    await settle()
    # 20 waiters ahead is ~2 s: a newcomer of tenant a with 1 s left is shed at once...
    assert admission.check("zone", deadline=clock.now + 1.0, tenant="a") is not None
    # ...but tenant b is served within a turn, so 1 s is plenty.
    assert admission.check("zone", deadline=clock.now + 1.0, tenant="b") is None
    holder.release()
    for _ in range(40):
        await settle()
        for w in waiters:
            if w.done() and isinstance(w.result(), Slot):
                w.result().release()
        if all(w.done() for w in waiters):
            break
    assert all(w.done() for w in waiters)
    for w in waiters:
        w.result().release()  # idempotent
    assert admission.inflight("zone") == 0


async def test_priority_comes_from_the_call_and_the_tenant_and_weights_apply_live() -> None:
    shares: dict[str, tuple[float, Priority]] = {"nightly": (1.0, BATCH)}
    admission, clock, _ = make(concurrency=1, queue=2, shares=shares)
    holder = await admission.acquire("zone", deadline=clock.now + 60, tenant="x")
    batch_job = asyncio.create_task(admission.acquire(
        "zone", deadline=clock.now + 60, tenant="acme", priority=BATCH))
    batch_tenant = asyncio.create_task(admission.acquire(
        "zone", deadline=clock.now + 60, tenant="nightly"))  # interactive call, batch tenant
    await settle()
    interactive = asyncio.create_task(admission.acquire("zone", deadline=clock.now + 60,
                                                        tenant="acme"))
    await settle()
    # The queue was full: the interactive newcomer shed a batch waiter.
    shed = [t for t in (batch_job, batch_tenant) if t.done()]
    assert len(shed) == 1 and isinstance(shed[0].exception(), Overloaded)
    holder.release()
    await settle()
    assert interactive.done()  # interactive first, although it came last
    interactive.result().release()
    await settle()
    rest = [t for t in (batch_job, batch_tenant) if not t.done() or t.exception() is None]
    assert len(rest) == 1 and rest[0].done()
    rest[0].result().release()

    # A reload that changes a weight applies to the next decision (the share is read per call).
    shares["acme"] = (4.0, INTERACTIVE)
    holders = [await admission.acquire("zone", deadline=clock.now + 60, tenant="acme")]
    queued = [asyncio.create_task(admission.acquire("zone", deadline=clock.now + 60,
                                                    tenant="acme")) for _ in range(2)]
    await settle()
    # acme (weight 4: 1 held + 2 waiting = 0.75 of a share) is under b's would-be 1 share.
    assert admission.check("zone", deadline=clock.now + 60, tenant="b") is not None
    shares["acme"] = (1.0, INTERACTIVE)
    assert admission.check("zone", deadline=clock.now + 60, tenant="b") is None
    holders[0].release()
    for task in queued:
        (await task).release()
    assert admission.inflight("zone") == 0


@pytest.mark.parametrize("queue", [0, 1])
async def test_a_zero_or_tiny_queue_still_sheds_cleanly(queue: int) -> None:
    admission, clock, _ = make(concurrency=1, queue=queue)
    holder = await admission.acquire("zone", deadline=clock.now + 60, tenant="a")
    if queue:
        first = asyncio.create_task(admission.acquire("zone", deadline=clock.now + 60,
                                                      tenant="a"))
        await settle()
    with pytest.raises(Overloaded) as info:
        await admission.acquire("zone", deadline=clock.now + 60, tenant="a")
    assert info.value.reason == "queue_full"
    holder.release()
    if queue:
        (await first).release()
    assert admission.inflight("zone") == 0
