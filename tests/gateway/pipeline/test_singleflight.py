"""Singleflight: one leader per key, shared results and errors, cancellation, no leaks."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from gateway.pipeline.singleflight import FlightAbandoned, SingleFlight


async def do(sf: SingleFlight[str, int], key: str, fn: Any) -> tuple[int, bool]:
    """How the pipeline uses a flight: lead it (settle it whatever happens) or join it."""
    fut, leader = sf.claim(key)
    if not leader:
        return await sf.join(fut), True
    try:
        value: int = await fn()
    except BaseException as exc:
        sf.reject(key, exc)
        raise
    sf.resolve(key, value)
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
    sf.resolve("k", "v")
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
        sf.reject(f"k{i}", RuntimeError("nobody listened"))
        del fut
    await asyncio.sleep(0)  # let the done callbacks run
    gc.collect()
    await asyncio.sleep(0)
    assert errors == []
    assert len(sf) == 0


async def test_membership_and_settling_an_unknown_key_is_a_no_op() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    assert "k" not in sf
    sf.claim("k")
    assert "k" in sf and "other" not in sf
    sf.reject("other", RuntimeError("x"))  # nobody claimed it: nothing happens
    sf.resolve("other", 1)
    assert len(sf) == 1


async def test_a_cancelled_leader_reads_as_abandoned_with_the_cancellation_as_cause() -> None:
    sf: SingleFlight[str, int] = SingleFlight()
    fut, _ = sf.claim("k")
    cancelled = asyncio.CancelledError()
    sf.reject("k", cancelled)
    with pytest.raises(FlightAbandoned) as err:
        await sf.join(fut)
    assert str(err.value) == "the leading request was cancelled"
    assert err.value.__cause__ is cancelled
