"""Upstream against real loopback OIP servers: retries, error mapping, deadlines, failover, hedging.

The backends are ``FakeBackend`` servers (real sockets, real HTTP) because these tests need
backends that die, hang, shed or answer garbage on cue; end-to-end tests with the real backend
live with the pipeline's tests.

The tests under load (overload sheds, a saturated near tier, a slow backend's share, hedging)
stand for the gateway's side of overload: its queue, shedding, failover and balancing, given a
backend whose service time is fixed (``delay_s``) and whose capacity is known. They cannot show
the real model's behaviour under the same load (dynamic batching, service time that grows with
batch size and text length, its own queue and priorities): each such test says so where it
matters, and the real-model scheduling tests cover it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import numpy as np
import pytest

from gateway.errors import BadGateway, DeadlineExceeded, GatewayError, Overloaded
from gateway.upstream import AiohttpTransport, InferResult, Request
from gateway.upstream.health import HealthChecker
from tests.gateway.routing.oip_fake import fake_embedding
from tests.gateway.upstream.upstream_rig import Build


async def test_embeddings_come_back_checked_with_timings_and_headers(build: Build,
                                                                     fakes: Any) -> None:
    backend = await fakes()
    rig = await build([(backend, "a")])
    result = await rig.embed(["one", "two", "three"], rid="abc-123")
    expected = np.array([fake_embedding(t, backend.dim) for t in ("one", "two", "three")],
                        dtype=np.float32)
    assert result.embeddings.dtype == np.float32 and result.embeddings.shape == (3, 8)
    np.testing.assert_array_equal(result.embeddings, expected)
    assert (result.backend, result.zone, result.model_version) == (
        f"127.0.0.1:{backend.port}", "a", "1")
    assert (result.queue_ms, result.compute_ms) == (0.5, 1.5)
    assert result.upstream_s > 0
    assert backend.last_headers["X-Request-Id"] == "abc-123"
    assert 0 < int(backend.last_headers["X-Request-Timeout-Ms"]) <= 5000
    assert rig.metric("gateway_backend_requests_total", backend=result.backend, zone="a",
                      outcome="ok") == 1
    assert rig.metric("gateway_upstream_batch_size_count") == 1
    assert rig.router.states[0].inflight == 0 and rig.admission.inflight("zone") == 0


async def test_connection_refused_is_retried_on_another_backend(build: Build,
                                                                fakes: Any) -> None:
    dead = await fakes(start=False)  # nothing listens on its port
    alive = await fakes()
    rig = await build([(dead, "a"), (alive, "b")])
    result = await rig.embed()
    assert result.zone == "b"
    assert rig.metric("gateway_upstream_retries_total", reason="connect_failure") == 1
    assert rig.router.states[0].consecutive_gateway_failures == 1

    no_retry = await build([(dead, "a"), (alive, "b")], retry=False)
    with pytest.raises(BadGateway, match="could not reach"):
        await no_retry.embed()


async def test_backend_503_is_retried_and_503_everywhere_sheds_with_retry_after(
    build: Build, fakes: Any,
) -> None:
    busy, spare = await fakes(), await fakes()
    busy.overloaded = True
    rig = await build([(busy, "a"), (spare, "b")])
    assert (await rig.embed()).zone == "b"
    assert rig.metric("gateway_upstream_retries_total", reason="http_503") == 1
    assert rig.router.states[0].consecutive_5xx == 0  # backpressure is not breakage

    spare.overloaded = True
    with pytest.raises(Overloaded) as info:
        await rig.embed()
    assert info.value.reason == "backend_overloaded"
    assert info.value.headers()["Retry-After"] == "3"  # the backend's own hint
    assert rig.metric("gateway_shed_total", reason="backend_overloaded") == 1


@pytest.mark.parametrize("knob", ["garbage", "wrong_shape"])
async def test_bad_answers_are_502_and_not_retried(build: Build, fakes: Any, knob: str) -> None:
    bad, good = await fakes(), await fakes()
    setattr(bad, knob, True)
    rig = await build([(bad, "a"), (good, "b")])
    with pytest.raises(BadGateway) as info:
        await rig.embed(["x", "y"])
    assert info.value.status == 502
    assert good.infer_requests == 0
    assert rig.router.states[0].consecutive_5xx == 1


async def test_backend_errors_map_to_502_with_its_message(build: Build, fakes: Any) -> None:
    backend = await fakes()
    rig = await build([(backend, "a")])
    backend.error_status = 400
    with pytest.raises(BadGateway, match="fake error 400"):
        await rig.embed()
    assert rig.router.states[0].consecutive_5xx == 0  # a 4xx is our bug, not its failure
    backend.error_status = 500
    with pytest.raises(BadGateway, match="answered 500"):
        await rig.embed()
    assert rig.router.states[0].consecutive_5xx == 1


async def test_deadline_with_a_hanging_backend_is_504_and_cancels_the_call(
    build: Build, fakes: Any,
) -> None:
    backend = await fakes()
    backend.hang = True
    rig = await build([(backend, "a")])
    with pytest.raises(DeadlineExceeded):
        await rig.embed(timeout_s=0.2)
    for _ in range(100):  # the server sees the client hang up (bounded wait)
        if backend.cancelled:
            break
        await asyncio.sleep(0.01)
    assert backend.cancelled == 1
    assert rig.router.states[0].inflight == 0 and rig.admission.inflight("zone") == 0
    assert rig.router.states[0].consecutive_5xx == 0  # the client's deadline, not a fault


async def test_read_timeout_is_504_and_counts_against_the_backend(build: Build,
                                                                  fakes: Any) -> None:
    backend = await fakes()
    backend.hang = True
    rig = await build([(backend, "a")], read_timeout_s=0.2)
    with pytest.raises(DeadlineExceeded, match="per-try timeout"):
        await rig.embed(timeout_s=5.0)
    assert rig.router.states[0].consecutive_gateway_failures == 1


async def test_deadline_expiring_in_the_queue_never_reaches_the_backend(
    build: Build, fakes: Any,
) -> None:
    backend = await fakes()
    backend.delay_s = 0.4
    rig = await build([(backend, "a")], tier_concurrency=1)
    first = asyncio.create_task(rig.embed(timeout_s=5.0))
    await asyncio.sleep(0.05)
    with pytest.raises(DeadlineExceeded):
        await rig.embed(timeout_s=0.1, rid="late")
    await first
    assert backend.infer_requests == 1
    assert rig.metric("gateway_shed_total", reason="expired") == 1


async def test_overload_gives_fast_503s_and_a_bounded_queue(build: Build, fakes: Any) -> None:
    """Stands for: a full tier queue sheds at once with Retry-After and the backend never sees
    more than the tier's concurrency. Cannot show: when the real backend would itself shed (its
    queue and batching are not modelled by a fixed 0.3 s delay)."""
    backend = await fakes()
    backend.delay_s = 0.3
    rig = await build([(backend, "a")], tier_concurrency=2, tier_queue=3)
    outcomes: list[BaseException | InferResult] = []  # in the order they finished

    async def one(i: int) -> None:
        try:
            outcomes.append(await rig.embed([f"t{i}"], timeout_s=5.0))
        except GatewayError as exc:
            outcomes.append(exc)

    tasks = [asyncio.create_task(one(i)) for i in range(40)]
    await asyncio.sleep(0.05)
    assert rig.admission.queue_depth("zone") == 3
    await asyncio.gather(*tasks)
    shed = [o for o in outcomes if isinstance(o, Overloaded)]
    assert len(shed) == 35 and all(o.reason == "queue_full" for o in shed)
    assert all(o.headers().get("Retry-After") for o in shed)
    # Every shed answer came before any real one (ordering, not a time bound).
    assert all(isinstance(o, Overloaded) for o in outcomes[:35])
    assert backend.max_inflight <= 2
    assert rig.metric("gateway_shed_total", reason="queue_full") == 35


async def test_near_tier_saturated_fails_over_to_the_next_tier(build: Build, fakes: Any) -> None:
    """Stands for: a saturated near tier sends the next request to the next tier instead of
    queueing it. Cannot show: when a real backend counts as saturated (that is the learned
    limit's job, with a fixed tier concurrency here)."""
    near, far = await fakes(), await fakes()
    near.delay_s = 0.3
    rig = await build([(near, "a"), (far, "b")], tier_concurrency=1, tier_queue=0)
    first = asyncio.create_task(rig.embed(["a"]))
    await asyncio.sleep(0.05)
    assert (await rig.embed(["b"])).zone == "b"
    assert (await first).zone == "a"
    assert rig.metric("gateway_shed_total", reason="queue_full") == 0


async def test_no_backend_available_is_503(build: Build, fakes: Any) -> None:
    backend = await fakes()
    rig = await build([(backend, "a")])
    rig.router.set_health(rig.router.states[0], False)
    with pytest.raises(Overloaded) as info:
        await rig.embed()
    assert info.value.reason == "no_backend"
    assert not rig.upstream.ready()
    assert backend.infer_requests == 0


async def test_killing_the_near_backend_mid_stream_fails_no_request(build: Build,
                                                                    fakes: Any) -> None:
    near, far = await fakes(), await fakes()
    near.delay_s = far.delay_s = 0.005
    rig = await build([(near, "a"), (far, "b")], health_interval_s=0.1, health_timeout_s=0.5,
                      base_ejection_s=0.3, consecutive_gateway_failure=2)
    checker = HealthChecker(rig.router, rig.transport, rig.settings, models=("minilm",))
    await checker.start()
    served: dict[int, str] = {}
    failures: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            served[i] = (await rig.embed([f"text {i}"], timeout_s=2.0)).zone
        except GatewayError as exc:
            failures.append(exc)

    tasks: list[asyncio.Task[None]] = []
    try:
        for i in range(200):  # ~3 s of open-loop traffic, one request every 15 ms
            if i == 60:
                await near.stop()
            if i == 120:
                await near.start()
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0.015)
        await asyncio.gather(*tasks)
    finally:
        await checker.stop()
    assert failures == []
    assert len(served) == 200
    assert all(zone == "a" for i, zone in served.items() if i < 55)
    assert all(served[i] == "b" for i in range(61, 120))
    assert sum(served[i] == "a" for i in range(170, 200)) >= 25  # back on the near zone


async def test_a_slow_backend_gets_a_smaller_share(build: Build, fakes: Any) -> None:
    """Stands for: P2C on in-flight x latency EWMA steers traffic away from the slower of two
    backends. Cannot show: the share against real backends whose latency moves with load and
    batch size (a 12x fixed gap here makes the outcome clear-cut)."""
    slow, fast = await fakes(), await fakes()
    slow.delay_s, fast.delay_s = 0.06, 0.005
    rig = await build([(slow, "a"), (fast, "a")])
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with gate:
            await rig.embed([f"t{i}"])

    await asyncio.gather(*(one(i) for i in range(160)))
    assert slow.infer_requests + fast.infer_requests == 160
    assert slow.infer_requests < 0.3 * 160


async def test_hedge_after_p95_takes_the_first_answer_and_cancels_the_loser(
    build: Build, fakes: Any,
) -> None:
    """Stands for: a call slower than the tier's p95 is hedged on another backend, the first
    answer wins and the loser is cancelled. Cannot show: whether hedging pays off against a real
    backend, where a hedge adds load to a batch queue."""
    a, b = await fakes(), await fakes()
    rig = await build([(a, "a"), (b, "a")], hedge_after_p95=True, hedge_min_samples=5)
    for i in range(20):  # learn the tier's p95
        await rig.embed([f"warm {i}"])
    state_a, state_b = rig.router.states
    a.hang = True
    hedged_before = rig.metric("gateway_upstream_hedges_total")  # warm-up may hedge too
    cancelled_before = a.cancelled
    state_b.inflight += 100  # make sure the primary is the hanging one
    state_a.ewma_s = state_b.ewma_s
    result = await rig.embed(["hedged"], timeout_s=5.0)
    state_b.inflight -= 100
    assert result.backend == state_b.name
    assert rig.metric("gateway_upstream_hedges_total") == hedged_before + 1
    for _ in range(100):
        if a.cancelled > cancelled_before:
            break
        await asyncio.sleep(0.01)
    assert a.cancelled == cancelled_before + 1
    assert state_a.inflight == 0 and state_b.inflight == 0
    assert rig.admission.inflight("zone") == 0


async def test_raw_passthrough_and_get(build: Build, fakes: Any) -> None:
    backend = await fakes()
    rig = await build([(backend, "a")])
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    raw = await rig.upstream.infer_raw("minilm", body, request_id="r",
                                       deadline=time.monotonic() + 5)
    assert raw.status == 200 and b'"embedding"' in raw.body
    assert raw.headers["X-Request-Id"] == "r"
    backend.error_status = 400
    raw = await rig.upstream.infer_raw("minilm", body, request_id="r",
                                       deadline=time.monotonic() + 5)
    assert raw.status == 400  # the caller renders a client error as it is

    meta = await rig.upstream.get("/v2/models/minilm", request_id="r")
    assert meta.status == 200 and b'"versions"' in meta.body
    assert (await rig.upstream.get("/v2/models/nope", request_id="r")).status == 404
    with pytest.raises(ValueError, match="absolute"):
        await rig.upstream.get("//elsewhere/", request_id="r")
    await backend.stop()
    with pytest.raises(BadGateway):
        await rig.upstream.get("/v2/models/minilm", request_id="r")
    with contextlib.suppress(Exception):
        await backend.start()


async def test_a_try_is_bounded_by_its_own_scope_not_an_aiohttp_timer_per_call(
        build: Build, fakes: Any) -> None:
    """Each try already runs under ``asyncio.timeout`` (the per-try timeout or the deadline,
    the sooner): the aiohttp call gets the transport's one connect-only timeout instead of a
    new ``ClientTimeout`` and a total timer per call (issue 24). Health checks and other
    unbounded callers keep their per-call total."""
    backend = await fakes()
    rig = await build([(backend, "a")], http_client="aiohttp")
    assert isinstance(rig.transport, AiohttpTransport)
    seen: list[Any] = []
    request = rig.transport.session.request

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["timeout"])
        return request(*args, **kwargs)

    rig.transport.session.request = recording  # type: ignore[method-assign]
    await rig.embed(["one"])
    await rig.embed(["two"])
    assert len(seen) == 2 and seen[0] is seen[1]  # one object, made once
    assert seen[0].total is None and seen[0].sock_connect == rig.settings.connect_timeout_s
    await rig.transport.send(Request("GET", backend.url + "/v2/health/ready"), timeout_s=2.5)
    assert seen[2].total == 2.5


async def test_only_answers_teach_the_service_time(build: Build, fakes: Any) -> None:
    """A backend's refusal (503) comes back at once: it says nothing of how long the backend
    takes, and counted as a service time it made the queue look short while the backend was
    refusing (issue 23's deadline burst sent ~100 calls to be refused). Answers do count."""
    busy = await fakes()
    busy.delay_s = 0.05
    rig = await build([(busy, "a")])
    tier = rig.router.tier_of(rig.router.states[0])
    await rig.embed()
    learned = rig.admission.service_time_s(tier)
    assert learned >= 0.05
    busy.overloaded = True
    for _ in range(5):
        with pytest.raises(Overloaded):
            await rig.embed()
    assert rig.admission.service_time_s(tier) == learned
    busy.overloaded = False
    busy.delay_s = 0.0
    await rig.embed()
    assert rig.admission.service_time_s(tier) < learned
