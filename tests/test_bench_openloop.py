"""The precise open-loop generator (bench/openloop.py) against a real aiohttp server on loopback.

The generator blocks its thread (its own epoll loop), so the server runs on an event loop in a
second thread. Functional only: statuses, parsing, timestamps, bounds; no speed assertions.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from bench import openloop
from tests.conftest import free_port


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _slow(_request: web.Request) -> web.Response:
    await asyncio.sleep(0.05)
    return web.Response(text="slow")


async def _shed(_request: web.Request) -> web.Response:
    return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "1"})


async def _bare503(_request: web.Request) -> web.Response:
    return web.json_response({"error": "busy"}, status=503)


async def _chunked(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(b"part one, ")
    await response.write(b"part two")
    await response.write_eof()
    return response


async def _once(_request: web.Request) -> web.Response:
    response = web.Response(text="one per connection")
    response.force_close()  # Connection: close
    return response


async def _timed(_request: web.Request) -> web.Response:
    return web.Response(text="timed", headers={
        "Server-Timing": "queue;dur=1.5, compute;dur=4.25;desc=x, bad;dur=?, miss, total;dur=7"})


async def _hang(_request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text="late")


async def _close(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    await asyncio.sleep(0.01)
    return web.Response(text="never sent")


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """A server thread on a free port; yields the port."""
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        for path, handler in (("/ok", _ok), ("/slow", _slow), ("/shed", _shed),
                              ("/bare503", _bare503), ("/chunked", _chunked), ("/hang", _hang),
                              ("/once", _once), ("/close", _close), ("/timed", _timed)):
            app.router.add_post(path, handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runner_box.append(runner)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield port
    asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def requests_to(port: int, *paths: str) -> Callable[[int], bytes]:
    encoded = [openloop.request_bytes("127.0.0.1", port, p, b'{"x": 1}') for p in paths]
    return lambda index: encoded[index % len(encoded)]


def test_every_request_answered_with_status_and_kernel_stamps(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/ok", "/shed", "/bare503"),
                          rate_per_s=300, requests=60, max_duration_s=5)
    assert [s.index for s in result.samples] == list(range(60))
    assert result.status_counts() == {200: 20, 503: 40}
    assert all(s.latency_s > 0 and s.lag_s >= 0 and s.error is None for s in result.samples)
    assert all(s.latency_s >= s.lag_s for s in result.samples)
    marked = {s.index % 3: s.info for s in result.samples if s.status == 503}
    assert marked == {1: {"retry_after": 1.0}, 2: {"retry_after": 0.0}}
    assert result.stopped_by == "count" and result.shed == 0
    assert result.kernel_stamps is (sys.platform == "linux")
    assert 1 <= result.connections < 60  # keep-alive: connections were reused


def test_server_timing_stages_come_back_in_info(server: int) -> None:
    """Each answer's ``Server-Timing`` durations (ms) are in ``info`` as ``t_<stage>``;
    entries without a readable ``dur`` are left out; a 503 keeps its ``retry_after``."""
    result = openloop.run("127.0.0.1", server, requests_to(server, "/timed", "/ok", "/shed"),
                          rate_per_s=200, requests=6, max_duration_s=5)
    infos = {s.index % 3: s.info for s in result.samples}
    assert infos == {0: {"t_queue": 1.5, "t_compute": 4.25, "t_total": 7.0}, 1: None,
                     2: {"retry_after": 1.0}}
    assert openloop.server_timing("a;dur=1;x=2, b;desc=y, c;dur=3") == {"t_a": 1.0, "t_c": 3.0}


def test_latency_counts_the_whole_response(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/slow", "/chunked"),
                          rate_per_s=100, requests=10, max_duration_s=5)
    assert result.status_counts() == {200: 10}
    slow = [s.latency_s for s in result.samples if s.index % 2 == 0]
    assert min(slow) >= 0.049  # the server sleeps 50 ms before answering


def test_open_loop_does_not_wait_for_answers(server: int) -> None:
    """20 slow requests at 200/s: each is sent while the one before is still unanswered, on
    new connections. Ordering, not a time bound: a loaded machine only makes sends burstier,
    while a closed loop would overlap none."""
    result = openloop.run("127.0.0.1", server, requests_to(server, "/slow"), rate_per_s=200,
                          requests=20, max_duration_s=5, warm_connections=1)
    assert result.status_counts() == {200: 20}
    sent = sorted(result.samples, key=lambda s: s.sent_s)
    overlapping = sum(b.sent_s < a.sent_s + a.latency_s for a, b in itertools.pairwise(sent))
    assert overlapping >= 10
    assert result.connections >= 5  # overlapping requests each got their own connection


def test_connection_bound_sheds_arrivals_instead_of_growing(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/slow"), rate_per_s=400,
                          requests=40, max_duration_s=5, max_connections=2, warm_connections=2)
    assert result.connections == 2
    assert result.shed > 0 and len(result.samples) + result.shed == 40


def test_failures_are_samples_not_exceptions(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/hang", "/close", "/ok"),
                          rate_per_s=50, requests=6, max_duration_s=5, timeout_s=0.3)
    by_path = {s.index % 3: (s.status, s.error) for s in result.samples}
    assert by_path[0] == (0, "TimeoutError")
    assert by_path[1] == (0, "ConnectionClosed")
    assert by_path[2] == (200, None)
    assert len(result.samples) == 6


def test_time_bound_stops_scheduling(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/ok"), rate_per_s=100,
                          requests=10_000, max_duration_s=0.2)
    assert result.stopped_by == "time"
    assert 10 <= len(result.samples) <= 21


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        openloop.run("127.0.0.1", 1, lambda _i: b"", rate_per_s=0, requests=1,
                     max_duration_s=1)


def test_connection_close_is_honoured(server: int) -> None:
    result = openloop.run("127.0.0.1", server, requests_to(server, "/once"), rate_per_s=100,
                          requests=8, max_duration_s=5, warm_connections=1)
    assert result.status_counts() == {200: 8}  # no request lost on a closed connection
    assert result.connections == 8


def test_refused_connections_are_failed_samples() -> None:
    port = free_port()  # nothing listens there
    result = openloop.run("127.0.0.1", port, lambda _i: b"", rate_per_s=200, requests=4,
                          max_duration_s=5, warm_connections=0)
    assert [(s.status, s.error) for s in result.samples] == [(0, "ConnectionRefusedError")] * 4
