"""The history service: one sampler per host, every worker answering with the host's points.

Two ``History`` objects on one directory stand for two workers: the ``flock`` that elects the
sampler is per open file, so it excludes a second holder in the same process as it does in
another (tests/gateway/telemetry/test_ring.py shows it across processes, and
tests/gateway/http/test_dashboard.py with a real two-worker gateway).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.telemetry.history import Point
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.sampler import History
from gateway.telemetry.samples import Samples

EMBED = "/v1/embeddings"
FAST = 0.05  # seconds between points in these tests


def hits(points: list[Point]) -> float:
    return float(sum(p["requests"].get("HIT", 0) for p in points))


async def until(check: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """Waits for ``check()`` (or the coroutine it returns) to be true; a generous bound, since
    the machine may be loaded: the test asserts what happens, never how fast."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(FAST)


async def at_least(history: History, n: int) -> bool:
    return len(await history.points()) >= n


async def test_one_worker_keeps_a_bounded_history_in_memory() -> None:
    m = GatewayMetrics(CollectorRegistry())
    history = History(lambda: Samples(m.registry), interval_s=FAST, window_s=20 * FAST)
    assert history.sampling and history.sampler_pid() == os.getpid()
    history.start()
    try:
        await until(lambda: at_least(history, 1), "a first point (after the first reading)")
        m.requests.labels(EMBED, "200", "HIT").inc(6)

        async def counted() -> bool:
            return hits(await history.points()) == 6

        await until(counted, "the 6 hits reach the history")
        await until(lambda: at_least(history, 20), "the window fills", 30.0)
        assert len(await history.points()) <= 20
        newest = (await history.points())[-1]["t"]
        assert await history.points(since=newest) == []
    finally:
        await history.stop()



async def test_one_sampler_per_host_and_a_takeover_keeps_the_history(tmp_path: Path) -> None:
    m = GatewayMetrics(CollectorRegistry())

    def collect() -> Samples:
        return Samples(m.registry)

    a = History(collect, directory=tmp_path, interval_s=FAST, window_s=600 * FAST)
    b = History(collect, directory=tmp_path, interval_s=FAST, window_s=600 * FAST)
    a.start()
    try:
        await until(lambda: at_least(a, 1), "the first worker samples")
        b.start()
        m.requests.labels(EMBED, "200", "HIT").inc(10)

        async def b_counts(n: int) -> bool:
            return hits(await b.points()) == n

        await until(lambda: b_counts(10), "the other worker serves the sampled points")
        assert not b.sampling
        assert a.sampler_pid() == b.sampler_pid() == os.getpid()
        from_b = await b.points()
        assert (await a.points())[: len(from_b)] == from_b  # one history, whoever answers
        first = from_b[0]["t"]

        await a.stop()  # the sampler goes away (a dead process frees its flock the same way)
        await until(lambda: b.sampling, "the other worker takes over")
        size = len(await b.points())
        await until(lambda: at_least(b, size + 1), "the new sampler appends")
        m.requests.labels(EMBED, "200", "HIT").inc(5)
        await until(lambda: b_counts(15), "the new sampler counts what follows")
        points = await b.points()
        assert points[0]["t"] == first  # what the first sampler wrote is kept
        assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    finally:
        await a.stop()
        await b.stop()
