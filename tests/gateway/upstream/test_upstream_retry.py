"""The retry policy and the retry budget, over ``MemoryTransport`` (no sockets, no processes).

Each backend is a host name in the fake's URL; ``Hosts`` answers per host with a status, a
hang, or a wait on an event, and records which host each try reached, with its headers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.upstream import ConnectFailed, MemoryTransport, Reply, Request, Reset, Upstream
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.retry import RetryBudget, RetryPolicy

FIXED = AdaptiveSettings(enabled=False)  # a fixed limit: the adaptive one is on by default

Behaviour = Callable[[Request], Awaitable[Reply]]


def ok_reply(request: Request) -> Reply:
    texts = orjson.loads(request.body or b"{}")["inputs"][0]["data"]
    answer = {"model_name": "minilm", "model_version": "1", "outputs": [
        {"name": "embedding", "datatype": "FP32", "shape": [len(texts), 2],
         "data": [0.6, 0.8] * len(texts)}]}
    return Reply(200, orjson.dumps(answer), {})


def status(code: int) -> Behaviour:
    async def answer(request: Request) -> Reply:
        return Reply(code, orjson.dumps({"error": f"status {code}"}), {})
    return answer


async def healthy(request: Request) -> Reply:
    return ok_reply(request)


async def hang(request: Request) -> Reply:
    await asyncio.sleep(60)
    raise AssertionError("unreachable: the per-try timeout or the deadline cancels this")


@dataclass
class Hosts:
    """The fake backends: host name -> behaviour; every try that reached one, in order."""

    behaviour: dict[str, Behaviour]
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    async def __call__(self, request: Request) -> Reply:
        host = urlsplit(request.url).hostname or ""
        self.seen.append((host, dict(request.headers)))
        return await self.behaviour[host](request)

    def hosts(self) -> list[str]:
        return [host for host, _ in self.seen]


class Clock:
    """``time.monotonic`` plus a jump the test can add."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@dataclass
class Rig:
    upstream: Upstream
    router: Router
    hosts: Hosts
    registry: CollectorRegistry
    clock: Clock

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def embed(self, timeout_s: float = 5.0, rid: str = "r") -> str:
        """One request; the host that answered it."""
        result = await self.upstream.infer_texts(
            "minilm", ["hello"], request_id=rid, deadline=self.clock() + timeout_s)
        return result.backend


def rig(backends: dict[str, tuple[str, Behaviour]], *,
        admission: AdmissionSettings | None = None, **settings: Any) -> Rig:
    """``backends``: host -> (zone, behaviour); the gateway is in zone ``a``; ``admission``:
    its settings (a fixed limit otherwise)."""
    values: dict[str, Any] = {"region": "r1", "zone": "a", **settings}
    routing = RoutingSettings(**values)
    registry = CollectorRegistry()
    observer = MetricsObserver(GatewayMetrics(registry))
    specs = [BackendSpec(url=f"http://{host}:1", zone=zone, region="r1", name=host)
             for host, (zone, _) in backends.items()]
    clock = Clock()
    router = Router(specs, routing, clock=clock, rng=random.Random(3), observer=observer)
    hosts = Hosts({host: behaviour for host, (_, behaviour) in backends.items()})
    upstream = Upstream(MemoryTransport(hosts), router,
                        Admission(admission or AdmissionSettings(adaptive=FIXED),
                                  observer=observer), routing,
                        observer=observer, clock=clock)
    return Rig(upstream, router, hosts, registry, clock)


@pytest.mark.parametrize("code", [500, 502, 503, 504])
async def test_the_default_5xx_answers_are_retried_on_another_backend(code: int) -> None:
    r = rig({"near": ("a", status(code)), "far": ("b", healthy)})
    assert await r.embed() == "far"
    assert r.hosts.hosts() == ["near", "far"]
    assert r.metric("gateway_upstream_retries_total", reason=f"http_{code}") == 1
    assert [h["X-Attempt-Count"] for _, h in r.hosts.seen] == ["1", "2"]


async def test_a_status_outside_the_list_is_not_retried_unless_retry_on_says_5xx() -> None:
    r = rig({"near": ("a", status(501)), "far": ("b", healthy)})
    with pytest.raises(BadGateway, match="answered 501"):
        await r.embed()
    assert r.hosts.hosts() == ["near"]

    r = rig({"near": ("a", status(501)), "far": ("b", healthy)}, retry_on=("5xx",))
    assert await r.embed() == "far"

    r = rig({"near": ("a", status(500)), "far": ("b", healthy)}, retry_on=("gateway-error",))
    with pytest.raises(BadGateway, match="answered 500"):
        await r.embed()
    r = rig({"near": ("a", status(504)), "far": ("b", healthy)}, retry_on=("gateway-error",))
    assert await r.embed() == "far"

    r = rig({"near": ("a", status(502)), "far": ("b", healthy)},
            retriable_status_codes=(503,))
    with pytest.raises(BadGateway, match="answered 502"):
        await r.embed()
    assert r.hosts.hosts() == ["near"]


@pytest.mark.parametrize("code", [400, 404, 409, 413, 429])
async def test_a_4xx_is_never_retried(code: int) -> None:
    r = rig({"near": ("a", status(code)), "far": ("b", healthy)}, retry_on=(
        "5xx", "gateway-error", "reset", "connect-failure", "retriable-status-codes"))
    with pytest.raises(BadGateway, match=f"answered {code}"):
        await r.embed()
    raw = await r.upstream.infer_raw("minilm", {}, request_id="r",
                                     deadline=r.clock() + 5)
    assert raw.status == code  # the OIP passthrough renders it as it is
    assert r.hosts.hosts() == ["near", "near"]
    assert r.metric("gateway_upstream_retries_total", reason=f"http_{code}") == 0
    with pytest.raises(ValueError, match="4xx is the request's fault"):
        RoutingSettings(retriable_status_codes=(503, code))


async def test_connection_failures_and_resets_are_retried_as_retry_on_says() -> None:
    async def refused(request: Request) -> Reply:
        raise ConnectFailed("refused")

    async def reset(request: Request) -> Reply:
        raise Reset("ServerDisconnectedError")

    r = rig({"near": ("a", refused), "far": ("b", healthy)})
    assert await r.embed() == "far"
    assert r.metric("gateway_upstream_retries_total", reason="connect_failure") == 1
    r = rig({"near": ("a", reset), "far": ("b", healthy)})
    assert await r.embed() == "far"
    assert r.metric("gateway_upstream_retries_total", reason="reset") == 1

    r = rig({"near": ("a", reset), "far": ("b", healthy)}, retry_on=("connect-failure",))
    with pytest.raises(BadGateway, match="dropped the connection"):
        await r.embed()
    r = rig({"near": ("a", refused), "far": ("b", healthy)}, retry=False)
    with pytest.raises(BadGateway, match="could not reach"):
        await r.embed()
    assert r.hosts.hosts() == ["near"]


async def test_no_backend_is_tried_twice_and_num_retries_bounds_the_tries() -> None:
    failing = {f"a{i}": ("a", status(502)) for i in range(3)}
    r = rig(failing, num_retries=5)
    with pytest.raises(BadGateway, match="answered 502"):
        await r.embed()
    assert sorted(r.hosts.hosts()) == ["a0", "a1", "a2"]  # three hosts: three tries, no more

    r = rig({**failing, "b": ("b", healthy)}, num_retries=2)
    with pytest.raises(BadGateway):
        await r.embed()
    assert len(r.hosts.hosts()) == 3 and len(set(r.hosts.hosts())) == 3
    assert [h["X-Attempt-Count"] for _, h in r.hosts.seen] == ["1", "2", "3"]
    assert r.metric("gateway_upstream_retries_total", reason="http_502") == 2


async def test_a_retry_stays_in_the_near_tier_while_it_has_another_host() -> None:
    r = rig({"a1": ("a", status(502)), "a2": ("a", healthy), "b": ("b", healthy)})
    r.router.states[1].inflight = 50  # P2C would pick a1 first: a2 looks busy
    assert await r.embed() == "a2"
    assert r.hosts.hosts() == ["a1", "a2"]

    r = rig({"a1": ("a", status(502)), "a2": ("a", status(502)), "b": ("b", healthy),
             "x": ("x", healthy)}, num_retries=2)
    assert await r.embed() == "b"  # both near hosts tried, then the next tier (region)
    assert set(r.hosts.hosts()[:2]) == {"a1", "a2"}


async def test_a_near_host_down_moves_the_retry_to_the_farther_tier() -> None:
    r = rig({"a1": ("a", status(502)), "a2": ("a", healthy), "b": ("b", healthy)})
    r.router.set_health(r.router.states[1], False)
    assert await r.embed() == "b"
    assert r.hosts.hosts() == ["a1", "b"]


async def test_per_try_timeout_abandons_a_frozen_backend_for_another() -> None:
    r = rig({"near": ("a", hang), "far": ("b", healthy)}, per_try_timeout_ms=50)
    assert await r.embed(timeout_s=5.0) == "far"
    assert r.metric("gateway_upstream_retries_total", reason="per_try_timeout") == 1
    first, second = (int(h["X-Request-Timeout-Ms"]) for _, h in r.hosts.seen)
    assert first <= 50 and second <= 50  # each try is told its own time, not the request's
    near = r.router.states[0]
    assert near.consecutive_gateway_failures == 1 and near.inflight == 0

    r = rig({"near": ("a", hang), "far": ("b", healthy)}, per_try_timeout_ms=50,
            retry_on=("connect-failure",))
    with pytest.raises(DeadlineExceeded, match="per-try timeout"):
        await r.embed(timeout_s=5.0)


async def test_the_deadline_bounds_every_try_and_no_retry_starts_after_it() -> None:
    # A deadline shorter than the per-try timeout: the try gets the deadline, no retry after.
    r = rig({"near": ("a", hang), "far": ("b", healthy)}, per_try_timeout_ms=5000)
    with pytest.raises(DeadlineExceeded, match="deadline passed"):
        await r.embed(timeout_s=0.05)
    assert r.hosts.hosts() == ["near"]
    assert int(r.hosts.seen[0][1]["X-Request-Timeout-Ms"]) <= 50
    assert r.router.states[0].consecutive_gateway_failures == 0  # the client's time, not a fault

    # A failure that comes back after the deadline passed is not retried.
    clock_jump: list[Rig] = []

    async def slow_502(request: Request) -> Reply:
        clock_jump[0].clock.offset += 10.0  # the answer arrives after the deadline
        return Reply(502, b'{"error": "late"}', {})

    r = rig({"near": ("a", slow_502), "far": ("b", healthy)})
    clock_jump.append(r)
    with pytest.raises(BadGateway, match="late"):
        await r.embed(timeout_s=5.0)
    assert r.hosts.hosts() == ["near"]


def test_budget_arithmetic() -> None:
    budget = RetryBudget(percent=20.0, min_concurrency=3)
    budget.active = 10
    assert budget.limit() == 3  # 20% of 10 is 2: the minimum holds
    budget.active = 50
    assert budget.limit() == 10
    budget.active = 54
    assert budget.limit() == 10  # rounded down, as Envoy does
    assert all(budget.try_acquire() for _ in range(10))
    assert not budget.try_acquire() and budget.retries == 10
    budget.release()
    assert budget.try_acquire()
    none = RetryBudget(percent=0.0, min_concurrency=0)
    none.active = 1000
    assert not none.try_acquire()


def test_policy_conditions() -> None:
    default = RetryPolicy.from_settings(RoutingSettings())
    assert [default.retries(r) for r in ("connect_failure", "reset", "per_try_timeout")] == [
        True, True, True]
    assert [default.retries(f"http_{c}") for c in (500, 501, 502, 503, 504, 505)] == [
        True, False, True, True, True, False]
    assert not default.retries("http_404") and not default.retries("something_else")
    assert default.num_retries == 1
    assert RetryPolicy.from_settings(RoutingSettings(retry=False)).num_retries == 0
    connect_only = RetryPolicy.from_settings(RoutingSettings(retry_on=("connect-failure",)))
    assert connect_only.retries("connect_failure") and not connect_only.retries("reset")
    assert not connect_only.retries("http_503")


async def test_the_budget_holds_retries_at_its_share_of_requests_in_flight() -> None:
    n = 20
    release_first = asyncio.Event()
    release_far = asyncio.Event()
    first_tries = 0

    async def near(request: Request) -> Reply:
        nonlocal first_tries
        first_tries += 1
        if first_tries == n:
            release_first.set()  # every request in flight before any answer
        await release_first.wait()
        return Reply(502, b'{"error": "upstream gone"}', {})

    async def far(request: Request) -> Reply:
        await release_far.wait()
        return ok_reply(request)

    r = rig({"near": ("a", near), "far": ("b", far)}, retry_budget_percent=50.0,
            retry_budget_min_concurrency=2)
    tasks = [asyncio.create_task(r.embed(rid=f"r{i}")) for i in range(n)]
    for _ in range(200):  # bounded: until every request has its answer or its retry
        if sum(t.done() for t in tasks) + r.hosts.hosts().count("far") >= n:
            break
        await asyncio.sleep(0.005)
    # 20 in flight: 10 retries allowed; each refusal ends a request, so the limit only falls.
    assert r.hosts.hosts().count("far") == 10
    assert r.upstream.budget.retries == 10
    assert r.metric("gateway_upstream_retry_overflow_total", reason="http_502") == 10
    release_far.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(res == "far" for res in results) == 10
    assert sum(isinstance(res, BadGateway) for res in results) == 10
    assert r.upstream.budget.retries == 0 and r.upstream.budget.active == 0


async def test_a_wide_outage_sheds_with_retry_after_and_counts_refused_retries() -> None:
    r = rig({"a1": ("a", status(503)), "b1": ("b", status(503))}, retry_budget_percent=0.0,
            retry_budget_min_concurrency=0)
    with pytest.raises(Overloaded) as info:
        await r.embed()
    assert info.value.headers()["Retry-After"]
    assert r.hosts.hosts() == ["a1"]
    assert r.metric("gateway_upstream_retry_overflow_total", reason="http_503") == 1
    assert r.metric("gateway_shed_total", reason="backend_overloaded") == 1
