"""The priority gate over a real ``Admission`` and ``Router``: batch lines go only while no
interactive request waits and the tier has room under ``batch.share``; they wait otherwise."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.batch.gate import Gate, LoopLag
from gateway.routing.balancer import Router
from gateway.routing.config import BackendSpec, RoutingSettings
from gateway.telemetry.observer import NullObserver
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.admission.slots import Slot

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default


def parts(limit: int = 4) -> tuple[Admission, Router, str]:
    router = Router([BackendSpec(url="http://127.0.0.1:9", zone="z")], RoutingSettings(zone="z"))
    state = router.pick()
    assert state is not None  # backends count as healthy until their first check
    admission = Admission(AdmissionSettings(tier_concurrency=limit, adaptive=FIXED))
    return admission, router, router.tier_of(state)


def gate(admission: Admission, router: Router, *, share: float = 0.5,
         concurrency: int = 4) -> Gate:
    return Gate(admission, router, share=share, concurrency=concurrency, observer=NullObserver())


def hold(admission: Admission, tier: str, n: int) -> list[Slot]:
    slots = [admission.try_acquire(tier) for _ in range(n)]
    assert all(s is not None for s in slots)
    return [s for s in slots if s is not None]


async def test_lines_go_while_the_tier_has_room_under_the_share() -> None:
    admission, router, tier = parts()
    g = gate(admission, router, share=0.5)
    assert g.refusal() is None
    held = hold(admission, tier, 1)
    assert g.refusal() is None  # 1 in flight < 0.5 x 4
    held += hold(admission, tier, 1)
    assert g.refusal() == "busy"
    held.pop().release()
    assert g.refusal() is None
    for slot in held:
        slot.release()


async def test_a_waiting_interactive_request_holds_every_line_back() -> None:
    admission, router, tier = parts(limit=2)
    g = gate(admission, router, share=1.0)
    held = hold(admission, tier, 2)
    waiter = asyncio.create_task(admission.acquire(tier, deadline=time.monotonic() + 10))
    await asyncio.sleep(0)
    assert admission.queue_depth(tier) == 1
    assert g.refusal() == "queued"
    entering = asyncio.create_task(g.enter())
    await asyncio.sleep(0.05)
    assert not entering.done()  # still held back
    held.pop().release()  # goes to the waiting interactive request, not to the batch
    granted = await asyncio.wait_for(waiter, 5)
    assert admission.queue_depth(tier) == 0 and not entering.done()
    granted.release()
    held.pop().release()
    await asyncio.wait_for(entering, 5)  # room now: the line goes
    assert g.inflight == 1
    g.leave()


async def test_no_available_backend_holds_lines_back() -> None:
    admission, router, _tier = parts()
    for state in router.states:
        state.healthy = False
    assert gate(admission, router).refusal() == "no_backend"


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_a_process_runs_at_most_its_concurrency(concurrency: int) -> None:
    admission, router, _tier = parts()
    g = gate(admission, router, share=1.0, concurrency=concurrency)
    for _ in range(concurrency):
        await asyncio.wait_for(g.enter(), 5)
    extra = asyncio.create_task(g.enter())
    await asyncio.sleep(0.05)
    assert not extra.done() and g.inflight == concurrency
    g.leave()
    await asyncio.wait_for(extra, 5)
    assert g.inflight == concurrency


async def test_a_late_event_loop_holds_lines_back() -> None:
    admission, router, _tier = parts()
    lag = LoopLag()
    g = Gate(admission, router, share=1.0, concurrency=4, observer=NullObserver(), lag=lag)
    assert g.refusal() is None
    lag.value = 0.05  # timers 50 ms late: this process's CPU is saturated
    assert g.refusal() == "loop_busy"
    lag.start()  # an idle loop keeps time: the measured lag decays back under the limit
    try:
        deadline = time.monotonic() + 5
        while g.refusal() is not None:
            assert time.monotonic() < deadline, f"lag stays at {lag.value * 1000:.2f} ms"
            await asyncio.sleep(0.01)
    finally:
        await lag.stop()


async def test_calls_slowing_down_hold_lines_back_until_the_tier_is_idle() -> None:
    admission, router, tier = parts(limit=64)
    g = gate(admission, router, share=0.5)
    for _ in range(10):
        admission.observe(0.020, tier=tier)  # the floor: 20 ms slot-hold times
    assert g.refusal() is None
    held = hold(admission, tier, 1)
    for _ in range(10):
        admission.observe(0.060, tier=tier)  # calls queue inside the backend now
    assert g.refusal() == "slow"
    held.pop().release(observe=False)
    assert g.refusal() is None  # nothing in flight: a line goes (and refreshes the EWMA)
