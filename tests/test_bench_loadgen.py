"""The closed-loop load generator against a tiny aiohttp server on a real loopback socket.

Functional only: counts, recorded latencies, bounds in count and time, transport errors. No
assertions about speed. (Open-loop scheduling and shedding: tests/test_bench_openloop.py.)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.loadgen import Reply, Request, RequestFactory, percentile, run_closed
from tests.conftest import free_port


class Echo:
    """A server that answers after ``delay_s`` and records how many requests overlap."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.in_flight = 0
        self.peak = 0
        self.seen = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.seen += 1
        try:
            body = await request.read()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status = 500 if body == b"fail" else 200
            return web.json_response({"n": len(body)}, status=status)
        finally:
            self.in_flight -= 1


async def serve(echo: Echo) -> TestServer:
    app = web.Application()
    app.router.add_post("/echo", echo.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def factory(server: TestServer, fail_every: int = 0) -> RequestFactory:
    url = str(server.make_url("/echo"))

    def make(index: int) -> Request:
        failing = fail_every and index % fail_every == 0
        return Request(url=url, body=b"fail" if failing else b"x" * (index % 7))

    return make


def read_status(reply: Reply) -> Mapping[str, float]:
    return {"status": float(reply.status)}


async def test_closed_loop_sends_exactly_the_count_and_records_latency() -> None:
    echo = Echo(delay_s=0.002)
    server = await serve(echo)
    try:
        result = await run_closed(factory(server, fail_every=10),
                                  requests=60, concurrency=4, max_duration_s=30,
                                  inspect=read_status)
    finally:
        await server.close()
    assert result.mode == "closed" and result.stopped_by == "count"
    assert [s.index for s in result.samples] == list(range(60))
    assert echo.seen == 60
    assert 1 <= echo.peak <= 4
    assert result.status_counts() == {200: 54, 500: 6}
    assert len(result.ok) == 54
    assert all(s.latency_s > 0 and s.lag_s == 0 and s.error is None for s in result.samples)
    assert result.wall_s > 0 and result.throughput > 0
    assert result.latency_ms(50) <= result.latency_ms(99)
    assert result.info_mean("status") == pytest.approx((54 * 200 + 6 * 500) / 60)
    assert math.isnan(result.info_mean("absent"))


async def test_closed_loop_stops_at_the_time_cap() -> None:
    echo = Echo(delay_s=0.05)
    server = await serve(echo)
    try:
        result = await run_closed(factory(server),
                                  requests=100_000, concurrency=2, max_duration_s=0.3)
    finally:
        await server.close()
    assert result.stopped_by == "time"
    assert 0 < len(result.samples) < 100_000
    assert len(result.samples) == echo.seen
    # The cap stops new sends; what was in flight finishes within the request timeout.
    assert result.wall_s < 0.3 + 30


async def test_transport_errors_are_samples_not_crashes() -> None:
    url = f"http://127.0.0.1:{free_port()}/nothing-listens"
    result = await run_closed(lambda _: Request(url=url, method="GET"), requests=3,
                              concurrency=1, max_duration_s=10, timeout_s=5)
    assert len(result.samples) == 3
    assert all(s.status == 0 and s.error for s in result.samples)
    assert result.ok == [] and result.throughput == 0
    assert math.isnan(result.latency_ms(50))


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert math.isnan(percentile([], 50))
