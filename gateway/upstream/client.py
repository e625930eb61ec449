"""The upstream client: OIP v2 calls to the backends through a ``Transport`` (transport.py).

Each call: the router picks a backend (nearest tier, P2C), admission grants a slot in that tier
(failing over to the next tier when a tier would shed), the request goes out with
``X-Request-Id``, ``X-Request-Timeout-Ms`` (the time this try has: the per-try timeout within
the request's deadline) and ``X-Attempt-Count`` (1, then 2... on retries, as Envoy's
``x-envoy-attempt-count``), its body's ``parameters`` carry the backend scheduling priority and
the tenant's fairness key (schedule.py), and the answer is checked before anyone sees it.

A try that fails in a way the retry policy retries (retry.py: connection failures, resets,
per-try timeouts, the configured 5xx answers; never a 4xx) is retried up to ``num_retries``
times (inference is idempotent), each time on a backend not tried yet for this request, the
nearest tier first (a farther tier when the near one has no other available backend), only
while the request's deadline has time left and the retry budget allows. With
``hedge_after_p95`` a call slower than its tier's p95 gets a second copy on another backend and
the first answer wins.

Transport errors stop here; callers only see ``gateway.errors``:

    connection refused / reset / connect timeout  -> retried, then BadGateway (502)
    backend 503 on every try                      -> Overloaded(reason="backend_overloaded")
    per-try timeout / 504 answer on every try     -> DeadlineExceeded (504)
    request deadline passed                       -> DeadlineExceeded (504)
    backend 500, 502 on every try                 -> BadGateway (502)
    backend 4xx, malformed answer                 -> BadGateway (502), not retried
    no backend available                          -> Overloaded(reason="no_backend")
    every tier shedding                           -> Overloaded(reason="queue_full" | "deadline")

Shed counts for the reasons above are recorded here; the admission queue records ``expired``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.routing.backends import BackendState
from gateway.routing.balancer import Router
from gateway.routing.config import RoutingSettings
from gateway.routing.hedge import HedgePolicy
from gateway.telemetry.observer import NullObserver, Observer
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.fairqueue import INTERACTIVE, Priority
from gateway.upstream.admission.slots import PUBLIC
from gateway.upstream.results import InferResult, RawResult
from gateway.upstream.retry import RetryBudget, RetryPolicy
from gateway.upstream.schedule import SCHEDULE_PARAMETERS, Schedule
from gateway.upstream.transport import (
    ConnectError,
    ReadTimeout,
    Request,
    Transport,
    TransportError,
)
from gateway.upstream.tries import T, Tries, _Reply, _Who
from gateway.upstream.wire import error_message, infer_request_body, parse_embeddings


class Upstream(Tries):
    """Routes, admits, sends and checks backend calls; the pipeline's one way to a backend."""

    def __init__(
        self,
        transport: Transport,
        router: Router,
        admission: Admission,
        settings: RoutingSettings,
        *,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule | None = None,
    ) -> None:
        self._transport = transport
        self.schedule = schedule or Schedule(
            interactive=settings.backend_priority_interactive,
            batch=settings.backend_priority_batch, salt=settings.fairness_salt)
        """Each call's backend priority and fairness key."""
        self._router = router
        self._admission = admission
        self._settings = settings
        self._observer: Observer = observer or NullObserver()
        self._clock = clock
        self._hedge = HedgePolicy(settings) if settings.hedge_after_p95 else None
        self._policy = RetryPolicy.from_settings(settings)
        self.budget = RetryBudget(percent=settings.retry_budget_percent,
                                  min_concurrency=settings.retry_budget_min_concurrency)
        """The retry budget: requests and retries in flight."""

    def ready(self) -> bool:
        """At least one backend passes its health checks."""
        return self._router.ready()

    async def infer_texts(
        self, model: str, texts: Sequence[str], *, request_id: str, deadline: float,
        tenant: str = PUBLIC, priority: Priority = INTERACTIVE, route: str = "",
    ) -> InferResult:
        """Embeddings for ``texts`` (float32 ``[n, dim]``) from the best backend; ``tenant`` and
        ``priority`` place the call in admission's fair queue and, with ``route``, in the
        backend's (schedule.py)."""
        n = len(texts)
        body = infer_request_body(texts, self.schedule.params(
            tenant, route, priority, express=self._admission.quiet(tenant, priority)))
        self._observer.upstream_batch(n)

        def decode(reply: _Reply) -> InferResult:
            if reply.status != 200:
                raise BadGateway(
                    f"backend {reply.state.name} answered {reply.status}: "
                    f"{error_message(reply.body)}"
                )
            return self._decode_embeddings(model, n, reply)

        return await self._exchange(
            f"/v2/models/{model}/infer", body, request_id=request_id, deadline=deadline,
            decode=decode, who=(tenant, priority),
        )

    async def infer_raw(
        self, model: str, body: Mapping[str, Any], *, request_id: str, deadline: float,
        tenant: str = PUBLIC, priority: Priority = INTERACTIVE, route: str = "",
        client_priority: int = 0,
    ) -> RawResult:
        """OIP passthrough of ``body`` (an infer request object, without the scheduling
        parameters: the client's own ``priority`` comes as ``client_priority`` and may only
        lower the call's); the backend's 2xx/4xx answer as is; 5xx map to gateway errors."""
        own = body.get("parameters") or {}
        params = {**{k: v for k, v in own.items() if k not in SCHEDULE_PARAMETERS},
                  **self.schedule.params(tenant, route, priority, client_priority,
                                         express=self._admission.quiet(tenant, priority))}
        raw = orjson.dumps({**body, "parameters": params})

        def decode(reply: _Reply) -> RawResult:
            return RawResult(reply.status, reply.body, reply.headers, reply.state.name,
                             reply.state.spec.zone, reply.latency_s)

        return await self._exchange(
            f"/v2/models/{model}/infer", raw, request_id=request_id, deadline=deadline,
            decode=decode, who=(tenant, priority),
        )

    async def get(self, path: str, *, request_id: str) -> RawResult:
        """Passthrough GET (e.g. ``/v2/models/{name}``) to a healthy backend, any status."""
        if not path.startswith("/") or path.startswith("//"):
            raise ValueError(f"path must be absolute on the backend, got {path!r}")
        tried: list[BackendState] = []
        for _ in range(2):
            state = self._router.pick(tried) or (self._router.pick() if tried else None)
            if state is None:
                break
            tried.append(state)
            start = self._clock()
            try:
                reply = await self._transport.send(
                    Request("GET", state.url + path, headers={"X-Request-Id": request_id}),
                    timeout_s=self._settings.read_timeout_s)
            except ConnectError:
                continue
            except (ReadTimeout, TimeoutError):
                raise DeadlineExceeded(f"backend {state.name} did not answer") from None
            except TransportError as exc:
                raise BadGateway(f"backend {state.name} failed: {exc}") from None
            return RawResult(reply.status, reply.body, reply.headers, state.name,
                             state.spec.zone, self._clock() - start)
        if not tried:
            self._shed("no_backend")
            raise Overloaded("no backend available", reason="no_backend")
        raise BadGateway("could not connect to any backend")

    async def _exchange(
        self, path: str, body: bytes, *, request_id: str, deadline: float,
        decode: Callable[[_Reply], T], who: _Who = (PUBLIC, INTERACTIVE),
    ) -> T:
        self.budget.active += 1
        try:
            return await self._tries(path, body, request_id, deadline, decode, who)
        finally:
            self.budget.active -= 1


    def _decode_embeddings(self, model: str, n: int, reply: _Reply) -> InferResult:
        state = reply.state
        answer = parse_embeddings(reply.body, reply.headers, n, state.name)
        self._router.set_model_width(model, answer.vectors.shape[1])
        self._observer.upstream_timing(state.name, answer.queue_ms / 1000.0,
                                       answer.compute_ms / 1000.0)
        version = (answer.model_version or state.model_versions.get(model)
                   or self._router.model_version(model) or "")
        return InferResult(answer.vectors, state.name, state.spec.zone, answer.queue_ms,
                           answer.compute_ms, reply.latency_s, version, answer.token_counts)
