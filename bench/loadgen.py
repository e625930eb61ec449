"""A small async HTTP load generator for loopback benchmarks (closed loop), and the result
types every generator here reports in.

``run_closed``: ``concurrency`` clients, each sending its next request as soon as its previous
one is answered, until ``requests`` have been sent or ``max_duration_s`` has passed (requests in
flight then still finish, within ``timeout_s``). Throughput is what the server sustains; latency
is send to last body byte. Open-loop load (a fixed arrival rate) comes from
``bench/openloop.py``, which reports the same ``Sample``/``LoadResult``.

Requests come from a factory ``make(index) -> Request`` (pre-encode bodies: the generator's own
CPU time competes with the server on small machines). An optional ``inspect(reply)`` reads
numbers out of each response (a batch size, a cache-hit flag) into ``Sample.info``.

One ``aiohttp.ClientSession`` with a keep-alive pool serves a run; pass your own ``session`` to
reuse connections across runs. Transport failures are samples with ``status == 0`` and the
exception's class name in ``error``; they never abort a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One HTTP request to send (bodies already encoded)."""

    url: str
    method: str = "POST"
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """What ``inspect`` sees of a response."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Sample:
    """One request's outcome; times in seconds, ``sent_s`` relative to the run's start."""

    index: int
    sent_s: float
    latency_s: float  # closed: send -> body read; open: scheduled time -> body read
    lag_s: float  # open loop: how late the send was against its schedule; closed: 0
    status: int  # HTTP status; 0 when no response came (connection error, timeout)
    error: str | None = None  # exception class name when status == 0
    info: Mapping[str, float] | None = None  # what ``inspect`` returned


Inspect = Callable[[Reply], Mapping[str, float]]
RequestFactory = Callable[[int], Request]


@dataclass(frozen=True)
class LoadResult:
    """A finished run: every sample plus how the run ended."""

    mode: str  # "closed" or "open"
    samples: list[Sample]
    wall_s: float  # first send to last answer
    planned: int  # requests asked for
    shed: int = 0  # open loop: arrivals not sent because no connection was free
    stopped_by: str = "count"  # "count" or "time" (the duration cap ended the run first)

    @property
    def ok(self) -> list[Sample]:
        """Samples with a 2xx status."""
        return [s for s in self.samples if 200 <= s.status < 300]

    @property
    def throughput(self) -> float:
        """Successful requests per second of wall time."""
        return len(self.ok) / self.wall_s if self.wall_s > 0 else 0.0

    def status_counts(self) -> dict[int, int]:
        """Samples by HTTP status (0: no response)."""
        return dict(sorted(Counter(s.status for s in self.samples).items()))

    def latency_ms(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of successful requests' latency, in ms."""
        return percentile([s.latency_s for s in self.ok], q) * 1000.0

    def info_mean(self, key: str) -> float:
        """Mean of ``info[key]`` over the samples that reported it (nan when none did)."""
        values = [s.info[key] for s in self.samples if s.info is not None and key in s.info]
        return math.fsum(values) / len(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def client_session(*, pool: int, timeout_s: float = 30.0) -> aiohttp.ClientSession:
    """A session whose keep-alive pool holds ``pool`` connections (one per client)."""
    connector = aiohttp.TCPConnector(limit=pool, keepalive_timeout=60.0)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        auto_decompress=False,
    )


async def run_closed(
    make: RequestFactory,
    *,
    requests: int,
    concurrency: int,
    max_duration_s: float,
    timeout_s: float = 30.0,
    inspect: Inspect | None = None,
    session: aiohttp.ClientSession | None = None,
) -> LoadResult:
    """``concurrency`` clients send ``requests`` in all (fewer if ``max_duration_s`` ends the
    run; requests in flight then still finish, within ``timeout_s``)."""
    _check(requests >= 0 and concurrency >= 1 and max_duration_s > 0 and timeout_s > 0)
    indices = itertools.count()
    samples: list[Sample] = []
    stopped = False

    async def client(http: aiohttp.ClientSession, start: float, deadline: float) -> None:
        nonlocal stopped
        while True:
            if time.perf_counter() >= deadline:
                stopped = True
                return
            index = next(indices)
            if index >= requests:
                return
            sent = time.perf_counter()
            samples.append(await _send(http, make(index), index, start, sent, sent, inspect))

    async with _session(session, concurrency, timeout_s) as http:
        start = time.perf_counter()
        deadline = start + max_duration_s
        await asyncio.gather(*(client(http, start, deadline) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    samples.sort(key=lambda s: s.index)
    return LoadResult("closed", samples, wall, requests, 0, "time" if stopped else "count")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` to completion on a fresh event loop (uvloop when installed: it spends
    less of the generator's CPU per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def _send(
    http: aiohttp.ClientSession,
    request: Request,
    index: int,
    start: float,
    sent: float,
    due: float,
    inspect: Inspect | None,
) -> Sample:
    try:
        async with http.request(
            request.method, request.url, data=request.body, headers=request.headers
        ) as response:
            body = await response.read()
            status, headers = response.status, response.headers
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        done = time.perf_counter()
        return Sample(index, sent - start, done - due, sent - due, 0, type(exc).__name__)
    done = time.perf_counter()  # before inspect: its parsing is not the server's latency
    info = inspect(Reply(status, headers, body)) if inspect is not None else None
    return Sample(index, sent - start, done - due, sent - due, status, None, info)


@contextlib.asynccontextmanager
async def _session(
    given: aiohttp.ClientSession | None, pool: int, timeout_s: float
) -> AsyncIterator[aiohttp.ClientSession]:
    """The caller's session untouched, or a fresh one closed afterwards."""
    if given is not None:
        yield given
        return
    own = client_session(pool=pool, timeout_s=timeout_s)
    try:
        yield own
    finally:
        await own.close()


def _check(ok: bool) -> None:
    if not ok:
        raise ValueError("requests >= 0, concurrency >= 1, and duration and timeout > 0 are "
                         "required")

