"""The adaptive concurrency limit (gateway/upstream/admission/adaptive.py) and its place in
admission control.

Unit tests drive the gradient controller on a fake clock, so every limit is computed exactly.
The last tests run real HTTP over loopback: an Upstream in front of a fake OIP backend with a
fixed capacity (slots) must settle far below its ceiling, and one without a capacity limit must
grow to it.

What those two stand for: the controller reading a backend's capacity from latency alone
(queueing shows as RTT above minRTT), over real sockets and the real admission path. A fake
backend because only it has a known capacity (``slots``) and a flat service time, so the limit
it should settle near is known in advance. What they cannot show: the real model's curve, where
dynamic batching makes latency grow in steps with the batch size and the best limit depends on
text length and on the CPU or GPU; whether the limit tracks that is for the real-model
scheduling tests and the benches.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import Overloaded
from gateway.settings import SettingsError, load_settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.upstream.admission.adaptive import AdaptiveSettings, GradientLimit
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from tests.gateway.routing.oip_fake import FakeBackend
from tests.gateway.upstream.upstream_rig import Build

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(clock: Clock, *, max_limit: int = 64, **knobs: Any) -> GradientLimit:
    values: dict[str, Any] = {"window_s": 0.1, "min_limit": 3, "probe_requests": 4,
                              "probe_interval_s": 30.0}
    values.update(knobs)
    return GradientLimit(AdaptiveSettings(**values), max_limit, clock=clock,
                         rng=random.Random(7))


def feed(limit: GradientLimit, clock: Clock, latency_s: float, n: int = 1,
         step_s: float = 0.001, inflight: int | None = None) -> None:
    """``n`` calls, each granted with ``inflight`` in flight (default: the whole limit)."""
    for _ in range(n):
        clock.now += step_s
        limit.observe(latency_s, limit.granted(limit.limit if inflight is None else inflight))


def windows(limit: GradientLimit, clock: Clock, latency_s: float, count: int,
            inflight: int | None = None) -> list[int]:
    """``count`` update windows of samples at ``latency_s``; the limit after each."""
    seen = []
    for _ in range(count):
        # 3 samples cross one 0.1 s window
        feed(limit, clock, latency_s, n=3, step_s=0.04, inflight=inflight)
        seen.append(limit.limit)
    return seen


def probed(clock: Clock, min_rtt_s: float = 0.02, **knobs: Any) -> GradientLimit:
    limit = controller(clock, **knobs)
    feed(limit, clock, min_rtt_s, n=limit._settings.probe_requests)
    assert not limit.probing and limit.min_rtt_s == pytest.approx(min_rtt_s)
    return limit


def test_starts_by_measuring_min_rtt_at_the_floor() -> None:
    clock = Clock()
    limit = controller(clock)
    assert limit.probing and limit.limit == 3 and limit.min_rtt_s == 0.0
    for latency in (0.030, 0.010, 0.020):
        feed(limit, clock, latency)
    assert limit.probing  # 3 of 4 samples
    feed(limit, clock, 0.040)
    assert not limit.probing
    assert limit.min_rtt_s == pytest.approx(0.020)  # p50 (nearest rank) of 10, 20, 30, 40 ms
    assert limit.limit == 3  # the limit from before the probe


def test_grows_while_latency_stays_near_min_rtt_and_stops_at_the_ceiling() -> None:
    clock = Clock()
    limit = probed(clock)
    seen = windows(limit, clock, 0.020, 12)
    # gradient 1.25 (the buffer): 3 -> int(3.75 + sqrt(3.75)) = 5 -> 8 -> 13 -> ...
    assert seen[:3] == [5, 8, 13]
    assert seen == sorted(seen) and seen[-1] == 64
    assert max(seen) <= 64


def test_does_not_grow_on_a_limit_the_traffic_never_used() -> None:
    clock = Clock()
    limit = probed(clock)
    windows(limit, clock, 0.020, 3)
    assert limit.limit == 13
    assert windows(limit, clock, 0.020, 5, inflight=6) == [13] * 5  # 6 < 13 / 2: app-limited
    assert windows(limit, clock, 0.020, 1, inflight=7) == [20]  # half used: it may grow
    assert windows(limit, clock, 0.080, 1, inflight=1)[0] < 20  # falling needs no such proof


def answer(limit: GradientLimit, clock: Clock, at_s: float, latency_s: float) -> None:
    """One call answered at ``at_s`` after the clock's start, ``latency_s`` after its grant."""
    clock.now = 1000.0 + at_s
    limit.observe(latency_s, limit.granted(limit.limit))


def test_a_rise_waits_for_answers_of_calls_granted_at_the_new_limit() -> None:
    # Under a flood the backend queues calls longer than a window: fast answers of calls
    # granted before a rise must not raise the limit again before calls granted at the new
    # limit have answered (the limit went 5 -> 9 -> 17 -> 27 in 0.6 s without this).
    clock = Clock()
    limit = probed(clock)  # minRTT 20 ms; the probe ended at ~1000.004
    start = clock.now - 1000.0
    # The probe's calls ran at the floor; the first window's answers are of calls granted
    # after its end: a rise (3 -> 5).
    for i in range(1, 4):
        answer(limit, clock, start + 0.04 * i, 0.020)
    assert limit.limit == 5
    rose = clock.now - 1000.0
    # Three answers 2-6 ms after the rise, 10 ms each (so granted before it), and one of a
    # call granted after it: gradient 2, but one fresh sample in four is no evidence.
    for at in (0.002, 0.004, 0.006):
        answer(limit, clock, rose + at, 0.010)
    answer(limit, clock, rose + 0.101, 0.010)
    assert limit.limit == 5
    # The next window's answers are all of calls granted at 5: now it may rise.
    for at in (0.13, 0.16, 0.19, 0.21):
        answer(limit, clock, rose + at, 0.010)
    assert limit.limit > 5
    # Falling needs no such proof: slow answers of calls granted before it bring it down.
    high = limit.limit
    fell = clock.now - 1000.0
    for at in (0.02, 0.04, 0.06, 0.11):
        answer(limit, clock, fell + at, 0.200)
    assert limit.limit < high


def test_falls_when_latency_rises_and_never_below_the_floor() -> None:
    clock = Clock()
    limit = probed(clock)
    windows(limit, clock, 0.020, 12)
    assert limit.limit == 64
    seen = windows(limit, clock, 0.080, 5)  # 4x minRTT: gradient clamped to 0.5
    assert seen[0] == int(32 + math.sqrt(32))
    assert seen == sorted(seen, reverse=True)
    assert min(seen) >= 3
    assert limit.sample_rtt_s == pytest.approx(0.080)


def test_settles_where_latency_meets_the_buffer() -> None:
    """A backend with 4 slots of 20 ms: past 4 in flight each extra call queues 5 ms."""
    clock = Clock()
    limit = probed(clock)
    for _ in range(60):
        latency = 0.020 * max(1.0, limit.limit / 4)
        feed(limit, clock, latency, n=3, step_s=0.04)
    assert 4 <= limit.limit <= 9  # far below the 64 ceiling, a little above the 4 slots


def test_probes_again_after_the_interval_and_ignores_older_calls() -> None:
    clock = Clock()
    limit = probed(clock)
    windows(limit, clock, 0.020, 6)
    before = limit.limit
    assert before > 3
    in_flight = limit.granted()  # a call granted before the probe
    clock.now += 40.0  # past 30 s + at most 10% jitter
    feed(limit, clock, 0.020)
    assert limit.probing and limit.limit == 3
    limit.observe(0.500, in_flight)  # from the old regime: not part of the new minRTT
    feed(limit, clock, 0.010, n=4)
    assert not limit.probing
    assert limit.min_rtt_s == pytest.approx(0.010)
    assert limit.limit == before


def test_five_windows_at_the_floor_start_a_probe() -> None:
    clock = Clock()
    limit = probed(clock)
    windows(limit, clock, 1.0, 4)  # 50x minRTT: down to the floor, four windows there
    assert limit.limit == 3 and not limit.probing
    windows(limit, clock, 1.0, 1)
    assert limit.probing  # the old minRTT may be stale: measure it again
    feed(limit, clock, 0.5, n=4)
    assert limit.min_rtt_s == pytest.approx(0.5)


def test_windows_far_under_min_rtt_start_a_probe() -> None:
    """A minRTT measured on slow calls (a burst of long texts) is stale once the calls are
    short: at a gradient of 2 the limit would stay at its ceiling, and the queue would form in
    the backend (issue 23: a quiet tenant's p50 went from 33 to 175 ms that way)."""
    clock = Clock()
    limit = probed(clock, min_rtt_s=0.2)
    windows(limit, clock, 0.09, 2)  # under half: two windows, still no probe
    assert not limit.probing
    windows(limit, clock, 0.12, 1)  # not under half: the count starts again
    windows(limit, clock, 0.09, 2)
    assert not limit.probing
    windows(limit, clock, 0.09, 1)  # the third in a row
    assert limit.probing and limit.limit == 3
    feed(limit, clock, 0.01, n=4)
    assert not limit.probing and limit.min_rtt_s == pytest.approx(0.01)


@pytest.mark.parametrize(("knobs", "field"), [
    ({"window_s": 0}, "window_s"),
    ({"probe_interval_s": -1}, "probe_interval_s"),
    ({"percentile": 0}, "percentile"),
    ({"percentile": 101}, "percentile"),
    ({"buffer": -0.1}, "buffer"),
    ({"min_limit": 0}, "min_limit"),
    ({"probe_requests": 0}, "probe_requests"),
    ({"enabled": "yes"}, "enabled"),
])
def test_bad_adaptive_settings_name_the_field(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AdaptiveSettings(**knobs)


def test_gateway_settings_load_the_section_and_validate() -> None:
    assert load_settings(None, None, environ={}).admission.adaptive.enabled is True  # shipped
    loaded = load_settings(None, {"admission": {"adaptive": {
        "enabled": True, "window_s": 0.25, "min_limit": 2, "percentile": 90}}}, environ={})
    assert loaded.admission.adaptive == AdaptiveSettings(enabled=True, window_s=0.25,
                                                         min_limit=2, percentile=90.0)
    with pytest.raises(SettingsError,
                       match=r"^admission\.adaptive\.buffer: must be between 0 and 10"):
        load_settings(None, {"admission.adaptive.buffer": 11}, environ={})
    # A ceiling below the floor caps the floor: tier_concurrency 2 means at most 2 in flight,
    # probes included.
    capped = Admission(AdmissionSettings(tier_concurrency=2,
                                         adaptive=AdaptiveSettings(min_limit=3)))
    assert capped.limit("zone") == 2


async def test_admission_grants_queued_requests_when_the_limit_rises() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    settings = AdmissionSettings(
        tier_concurrency=16, tier_queue=8,
        adaptive=AdaptiveSettings(enabled=True, min_limit=1, probe_requests=1, window_s=0.01))
    admission = Admission(settings, observer=MetricsObserver(metrics), clock=clock)
    deadline = clock.now + 60.0
    assert admission.limit("zone") == 1
    first = await admission.acquire("zone", deadline=deadline)
    waiters = [asyncio.create_task(admission.acquire("zone", deadline=deadline))
               for _ in range(3)]
    await asyncio.sleep(0)
    assert admission.queue_depth("zone") == 3
    clock.now += 0.02
    first.release()  # ends the probe: minRTT 20 ms; the freed slot goes to one waiter
    await asyncio.sleep(0)
    assert admission.adaptive("zone") is not None
    assert admission.queue_depth("zone") == 2 and admission.inflight("zone") == 1
    # The probe ended without moving the limit; the minRTT gauge shows it all the same.
    assert admission.limit("zone") == 1
    assert registry.get_sample_value("gateway_adaptive_min_rtt_seconds",
                                     {"tier": "zone"}) == pytest.approx(0.02)
    granted = [w for w in waiters if w.done()]
    clock.now += 0.02  # held 20 ms (minRTT) and past the 10 ms window: limit 1 -> 2
    granted[0].result().release()
    await asyncio.sleep(0)
    assert admission.limit("zone") == 2
    assert admission.inflight("zone") == 2 and admission.queue_depth("zone") == 0
    assert registry.get_sample_value("gateway_concurrency_limit", {"tier": "zone"}) == 2
    assert registry.get_sample_value("gateway_adaptive_min_rtt_seconds",
                                     {"tier": "zone"}) == pytest.approx(0.02)
    for task in waiters:
        if task.done() and task.result() is not granted[0].result():
            task.result().release()
    await asyncio.gather(*waiters)


async def test_fixed_limit_is_reported_too() -> None:
    registry = CollectorRegistry()
    admission = Admission(AdmissionSettings(tier_concurrency=7, adaptive=FIXED),
                          observer=MetricsObserver(GatewayMetrics(registry)))
    slot = await admission.acquire("zone", deadline=time.monotonic() + 5)
    assert admission.limit("zone") == 7 and admission.adaptive("zone") is None
    assert registry.get_sample_value("gateway_concurrency_limit", {"tier": "zone"}) == 7
    slot.release()


async def drive(build: Build, backend: FakeBackend, *, clients: int, seconds: float) -> Any:
    # No wait bound (max_wait_factor): these tests watch the limit, not the queue.
    rig = await build([(backend, "a")], tier_concurrency=64, tier_queue=256, max_wait_factor=0,
                      adaptive=AdaptiveSettings(enabled=True, window_s=0.05, probe_requests=10))
    stop = time.monotonic() + seconds
    shed = 0

    async def client() -> None:
        nonlocal shed
        while time.monotonic() < stop:
            with contextlib.suppress(Overloaded):
                await rig.embed(["x"])
                continue
            shed += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return rig


async def test_real_backend_with_a_capacity_keeps_the_limit_near_it(
    build: Build, fakes: Any
) -> None:
    backend: FakeBackend = await fakes(start=False)
    backend.delay_s, backend.slots = 0.02, 4
    await backend.start()
    rig = await drive(build, backend, clients=32, seconds=2.5)
    limit = rig.admission.limit("zone")
    tracker = rig.admission.adaptive("zone")
    assert tracker is not None and tracker.min_rtt_s >= 0.02
    # 32 clients offered; the fixed ceiling (64) would have let all 32 into the 4 slots' queue.
    assert 3 <= limit <= 16, limit
    assert backend.max_inflight <= 24


async def test_real_backend_without_a_capacity_lets_the_limit_grow(
    build: Build, fakes: Any
) -> None:
    backend: FakeBackend = await fakes()
    backend.delay_s = 0.05
    rig = await drive(build, backend, clients=16, seconds=2.0)
    # Latency stays near minRTT, so the limit is no brake: from 3 it grows past the 16 clients
    # (and stops growing once they no longer use half of it) and all 16 reach the backend.
    assert rig.admission.limit("zone") >= 16
    assert backend.max_inflight == 16
