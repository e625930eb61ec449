"""A pipeline wired to an in-memory backend (MemoryTransport): fast, no sockets, no processes.

``WallClock`` ages entries without sleeping; ``ROUTES`` builds the same request for each of the
four cached routes, so the cache and privacy guarantees are checked on all of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from gateway.adapters.oip import parse_oip
from gateway.adapters.texts import parse_classify, parse_embeddings, parse_rank
from gateway.cache.keys import CacheKey
from gateway.cache.memory import MemoryCache
from gateway.cache.tiered import TieredCache
from gateway.pipeline import Call, Pipeline, Result
from gateway.pipeline.context import CacheDirectives, RequestContext
from gateway.pipeline.singleflight import SingleFlight
from gateway.policy.store import PolicyStore
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.telemetry.observer import NullObserver
from gateway.upstream import MemoryTransport, Reply, Request, Upstream
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings

OIP_ROUTE = "/v2/models/{name}/infer"
Charge = Callable[[int, int], Awaitable[None]]
"""The tenant's quota charge: (texts going to a backend, texts answered from cache)."""


class WallClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def vector(text: str, dim: int = 8) -> list[float]:
    """A deterministic unit vector per text (the fake model)."""
    seed = xxhash.xxh3_64_intdigest(text.encode("utf-8"))
    vec = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return [float(x) for x in vec / np.linalg.norm(vec)]


@dataclass
class FakeModel:
    """Answers OIP infer requests; ``fail`` makes it answer that status instead."""

    fail: int | None = None
    texts: list[list[str]] = field(default_factory=list)
    """The texts of every request that reached it, in order."""
    gate: asyncio.Event | None = None
    """While set to an unset event, every call waits for it (a request held in flight)."""
    urls: list[str] = field(default_factory=list)
    """The URL of every request that reached it, in order."""
    params: list[dict[str, Any]] = field(default_factory=list)
    """The OIP ``parameters`` of every request that reached it (priority, timeout...)."""
    fail_texts: set[str] = field(default_factory=set)
    """A request with any of these texts is answered 500 (one backend call fails, others not)."""
    headers: list[dict[str, str]] = field(default_factory=list)
    """The headers of every request that reached it (``X-Request-Timeout-Ms``...), in order."""
    token_counts: bool = True
    """Whether its answers report each text's token count (``parameters.token_counts``)."""

    async def __call__(self, request: Request) -> Reply:
        self.urls.append(request.url)
        self.headers.append(dict(request.headers))
        doc = orjson.loads(request.body or b"{}")
        self.params.append(doc.get("parameters") or {})
        texts = [t for tensor in doc["inputs"] for t in tensor["data"]]
        self.texts.append(texts)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0.005)  # a real call yields: identical requests meet in flight
        if self.fail is not None:
            return Reply(self.fail, b'{"error": "down"}', {})
        if self.fail_texts.intersection(texts):
            return Reply(500, b'{"error": "down"}', {})
        flat = [x for t in texts for x in vector(t)]
        answer = {"model_name": "minilm", "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": [len(texts), 8], "data": flat}],
            "parameters": {"token_counts": [len(t.split()) + 2 for t in texts]}}
        if not self.token_counts:
            del answer["parameters"]
        return Reply(200, orjson.dumps(answer), {"Server-Timing": "queue;dur=0.5, compute;dur=2"})

    @property
    def calls(self) -> int:
        return len(self.texts)


POLICY = """
version: unit-{n}
defaults:
  ttl: {ttl}
  stale_while_revalidate: {swr}
  stale_if_error: {sie}
  privacy:
    detectors: {{email: {email}, card: reject, secret: redact, phone: no_store}}
rules:
  - name: default
"""


def write_policy(folder: Path, *, n: int = 1, ttl: str = "1h", swr: str = "0s",
                 sie: str = "0s", email: str = "no_store") -> Path:
    path = folder / "policy.yaml"
    path.write_text(POLICY.format(n=n, ttl=ttl, swr=swr, sie=sie, email=email))
    return path


def _resolve(name: str) -> str:
    return "minilm"


# route -> (path for keys, body for one "subject" text, parser)
ROUTES: dict[str, tuple[str, Callable[[str], dict[str, Any]], Callable[[dict[str, Any]], Call]]]
ROUTES = {
    "embeddings": ("/v1/embeddings", lambda t: {"model": "minilm", "input": t},
                   lambda d: parse_embeddings(d, _resolve)),
    "classify": ("/v1/classify",
                 lambda t: {"model": "minilm", "input": t, "labels": ["news", "sport"]},
                 lambda d: parse_classify(d, _resolve)),
    "rank": ("/v1/rank", lambda t: {"model": "minilm", "query": t, "documents": ["x", "y"]},
             lambda d: parse_rank(d, _resolve)),
    "oip": (OIP_ROUTE, lambda t: {"id": "r1", "inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [t]}]},
        lambda d: parse_oip(d, "minilm")),
}


@dataclass
class Rig:
    pipeline: Pipeline
    model: FakeModel
    clock: WallClock
    policies: PolicyStore
    l1: MemoryCache
    route: str

    async def ask(self, text: str, *, cache_control: str | None = None,
                  timeout_s: float = 5.0, tenant: str = "public",
                  charge: Charge | None = None) -> tuple[Result, bytes]:
        path, body, parse = ROUTES[self.route]
        call = parse(body(text))
        ctx = RequestContext(request_id="t", route=path, tenant=tenant,
                             deadline=time.monotonic() + timeout_s,
                             directives=CacheDirectives.parse(cache_control), charge=charge)
        result = await self.pipeline.run(ctx, call)
        return result, call.render(result)


async def build(route: str, policy: Path) -> Rig:
    clock = WallClock()
    model = FakeModel()
    settings = RoutingSettings(retry=False)
    router = Router([BackendSpec(url="http://fake:1")], settings)
    upstream = Upstream(MemoryTransport(model), router, Admission(AdmissionSettings()), settings)
    policies = PolicyStore([policy])
    l1 = MemoryCache(max_entries=1000, max_bytes=10**7, clock=clock)
    pipeline = Pipeline(policies=policies, cache=TieredCache(l1, None), upstream=upstream,
                        model_version=lambda _m: "1", observer=NullObserver(), clock=clock)
    return Rig(pipeline, model, clock, policies, l1, route)


def watch_joins(rig: Rig) -> asyncio.Event:
    """An event set when a request joins another's flight."""
    joined = asyncio.Event()
    flights: SingleFlight[CacheKey, object] = rig.pipeline.flights  # type: ignore[assignment]
    join = flights.join

    async def joining(fut: asyncio.Future[object]) -> object:
        joined.set()
        return await join(fut)

    flights.join = joining  # type: ignore[method-assign]
    return joined


async def in_backend(rig: Rig, calls: int) -> None:
    """Until the fake model has been called ``calls`` times (ordering, not timing)."""
    for _ in range(1000):  # a request reaches the backend within a few loop turns
        if rig.model.calls >= calls:
            return
        await asyncio.sleep(0)
    raise AssertionError("the request never reached the backend")


async def orphaned_follower(rig: Rig, text: str, *, tenant: str = "public",
                            ) -> asyncio.Task[tuple[Result, bytes]]:
    """Two identical requests of ``tenant``: the first leads the flight and is cancelled inside
    the backend call while the second waits on it. Returns the second, still running: it
    fetches the text itself once ``rig.model.gate`` (set here, left closed) opens."""
    rig.model.gate = asyncio.Event()
    joined = watch_joins(rig)
    leader = asyncio.create_task(rig.ask(text, tenant=tenant))
    await in_backend(rig, rig.model.calls + 1)
    follower = asyncio.create_task(rig.ask(text, tenant=tenant))
    await asyncio.wait_for(joined.wait(), 5)
    leader.cancel()
    try:
        await leader
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the leader was answered, not cancelled")
    return follower
