"""Singleflight: one leader per key, shared results and errors, cancellation, no leaks."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from gateway.pipeline.singleflight import FlightAbandoned, SingleFlight


async def do(sf: SingleFlight[str, int], key: str, fn: Any, rank: int = 0) -> tuple[int, bool]:
    """How the pipeline uses a flight: lead it (settle it whatever happens) or join it."""
    fut, leader = sf.claim(key, rank)
    if not leader:
        return await sf.join(fut), True
    try:
        value: int = await fn()
    except BaseException as exc:
        sf.reject(key, fut, exc)
        raise
    sf.resolve(key, fut, value)
    return value, False


def watch(errors: list[dict[str, Any]]) -> None:
    """Collect what the loop's exception handler sees (e.g. 'exception was never retrieved')."""
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))


async def test_fifty_concurrent_calls_make_one_upstream_call() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    calls = 0
    gate = asyncio.Event()

    async def upstream() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42

    tasks = [asyncio.create_task(do(sf, "k", upstream)) for _ in range(50)]
    await asyncio.sleep(0)
    assert len(sf) == 1
    gate.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1
    assert [v for v, _ in results] == [42] * 50
    assert sum(shared for _, shared in results) == 49
    assert len(sf) == 0


async def test_claim_gives_one_leader() -> None:
    sf: SingleFlight[str, str] = SingleFlight()
    claims = [sf.claim("k") for _ in range(50)]
    assert sum(leader for _, leader in claims) == 1
    assert claims[0][1] and len({id(f) for f, _ in claims}) == 1
    followers = [asyncio.create_task(sf.join(f)) for f, _ in claims[1:]]
    sf.resolve("k", claims[0][0], "v")
    assert await asyncio.gather(*followers) == ["v"] * 49
    assert len(sf) == 0
    assert sf.claim("k")[1]  # settled: the next miss leads a new flight


async def test_leader_error_reaches_every_follower() -> None:
    sf: SingleFlight[str, int] = SingleFlight()

    async def boom() -> int:
        await asyncio.sleep(0.01)
        raise RuntimeError("backend 502")

    tasks = [asyncio.create_task(do(sf, "k", boom)) for _ in range(5)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert len(sf) == 0


async def test_cancelled_follower_does_not_cancel_the_others() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    gate = asyncio.Event()

    async def upstream() -> int:
        await gate.wait()
        return 7

    leader = asyncio.create_task(do(sf, "k", upstream))
    await asyncio.sleep(0)
    f1 = asyncio.create_task(do(sf, "k", upstream))
    f2 = asyncio.create_task(do(sf, "k", upstream))
    await asyncio.sleep(0)
    f1.cancel()
    await asyncio.sleep(0)
    gate.set()
    assert await leader == (7, False)
    assert await f2 == (7, True)
    assert f1.cancelled()
    assert len(sf) == 0


async def test_cancelled_leader_releases_followers_with_a_retryable_error() -> None:
    sf: SingleFlight[str, int] = SingleFlight()

    async def hang() -> int:
        await asyncio.Event().wait()
        return 0

    leader = asyncio.create_task(do(sf, "k", hang))
    await asyncio.sleep(0)
    follower = asyncio.create_task(do(sf, "k", hang))
    await asyncio.sleep(0)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    with pytest.raises(FlightAbandoned):
        await follower
    assert not follower.cancelled()
    assert len(sf) == 0


async def test_unjoined_rejections_do_not_warn() -> None:
    errors: list[dict[str, Any]] = []
    watch(errors)
    sf: SingleFlight[str, int] = SingleFlight()
    for i in range(10):
        fut, _ = sf.claim(f"k{i}")
        sf.reject(f"k{i}", fut, RuntimeError("nobody listened"))
        del fut
    await asyncio.sleep(0)  # let the done callbacks run
    gc.collect()
    await asyncio.sleep(0)
    assert errors == []
    assert len(sf) == 0


async def test_membership_and_settling_an_unknown_key_is_a_no_op() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    assert "k" not in sf
    fut, _ = sf.claim("k")
    assert "k" in sf and "other" not in sf
    sf.reject("other", fut, RuntimeError("x"))  # not the key's flight: nothing forgotten
    assert len(sf) == 1 and "k" in sf


async def test_a_cancelled_leader_reads_as_abandoned_with_the_cancellation_as_cause() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut, _ = sf.claim("k")
    cancelled = asyncio.CancelledError()
    sf.reject("k", fut, cancelled)
    with pytest.raises(FlightAbandoned) as err:
        await sf.join(fut)
    assert str(err.value) == "the leading request was cancelled"
    assert err.value.__cause__ is cancelled


async def test_a_better_ranked_caller_leads_its_own_flight_the_older_one_still_settles() -> None:
    """An interactive request (rank 1) after a Batch API line (rank 3) of the same text does
    not wait at the line's priority: it leads a flight of its own, which takes the key; a later
    line joins the better flight; the older flight's followers get the older leader's value."""
    sf: SingleFlight[str, int] = SingleFlight()
    line, led = sf.claim("k", 3)
    line_follower, follows = sf.claim("k", 3)
    assert led and not follows and line_follower is line
    fast, led_fast = sf.claim("k", 1)
    assert led_fast and fast is not line
    assert sf.claim("k", 1) == (fast, False)  # same rank joins
    assert sf.claim("k", 2) == (fast, False)  # worse rank joins the better flight
    waiting = asyncio.create_task(sf.join(line_follower))
    sf.resolve("k", line, 30)  # the older leader settles: the newer flight keeps the key
    assert await waiting == 30
    assert "k" in sf and sf.claim("k", 1) == (fast, False)
    sf.resolve("k", fast, 10)
    assert await sf.join(fast) == 10
    assert len(sf) == 0


async def test_a_worse_ranked_caller_joins_a_better_flight() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    gate = asyncio.Event()
    calls: list[int] = []

    async def upstream(rank: int) -> int:
        calls.append(rank)
        await gate.wait()
        return rank

    interactive = asyncio.create_task(do(sf, "k", lambda: upstream(1), rank=1))
    await asyncio.sleep(0)
    line = asyncio.create_task(do(sf, "k", lambda: upstream(3), rank=3))
    await asyncio.sleep(0)
    gate.set()
    assert await interactive == (1, False)
    assert await line == (1, True)
    assert calls == [1]


async def test_a_rejected_older_flight_leaves_the_newer_one_in_place() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    line, _ = sf.claim("k", 3)
    fast, _ = sf.claim("k", 1)
    sf.reject("k", line, RuntimeError("line failed"))
    with pytest.raises(RuntimeError):
        await sf.join(line)
    assert sf.claim("k", 1) == (fast, False)
    sf.reject("k", fast, RuntimeError("x"))
    assert len(sf) == 0
