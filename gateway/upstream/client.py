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

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.routing.backends import BackendState
from gateway.routing.balancer import BackendResult, Router
from gateway.routing.config import RoutingSettings
from gateway.routing.hedge import HedgePolicy, race
from gateway.telemetry.observer import NullObserver, Observer
from gateway.upstream.admission.control import PUBLIC, Admission, Slot
from gateway.upstream.admission.fairqueue import INTERACTIVE, Priority
from gateway.upstream.results import InferResult, RawResult
from gateway.upstream.retry import RetryBudget, RetryPolicy
from gateway.upstream.schedule import Schedule
from gateway.upstream.transport import (
    ConnectError,
    ReadTimeout,
    Request,
    Transport,
    TransportError,
)
from gateway.upstream.wire import (
    Retryable,
    classify_exception,
    error_message,
    exception_error,
    infer_request_body,
    parse_embeddings,
    status_outcome,
)

T = TypeVar("T")
_Who = tuple[str, Priority]  # (tenant, priority class): a call's place in admission's fair queue


@dataclass(frozen=True, slots=True)
class _Send:
    """What every try of one request sends, and its try number."""

    path: str
    body: bytes
    request_id: str
    deadline: float
    attempt: int


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes
    headers: Mapping[str, str]
    state: BackendState
    latency_s: float


class Upstream:
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
        body = infer_request_body(texts, self.schedule.params(tenant, route, priority))
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
        params = {**(body.get("parameters") or {}),
                  **self.schedule.params(tenant, route, priority, client_priority)}
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

    async def _tries(
        self, path: str, body: bytes, request_id: str, deadline: float,
        decode: Callable[[_Reply], T], who: _Who,
    ) -> T:
        """The first try, then retries while the policy, the deadline, an untried backend and
        the budget allow; the last try's error when they stop."""
        tried: list[BackendState] = []
        last: Retryable | None = None
        attempt = 1
        while True:
            exclude: Sequence[BackendState] = tried
            if last is not None:
                if (attempt > self._policy.num_retries + 1
                        or not self._policy.retries(last.reason) or self._clock() >= deadline):
                    break
                if self._router.pick(tried) is None:
                    if last.reason != "reset":
                        break
                    # The one backend left may just have dropped a stale keep-alive connection:
                    # the only case where a retry goes back to a backend already tried.
                    exclude = ()
                if not self.budget.try_acquire():
                    self._observer.retry_overflow(last.reason)
                    break
            try:
                admitted = await self._admit(deadline, exclude, who)
                if admitted is None:
                    if last is not None:
                        break
                    self._shed("no_backend")
                    raise Overloaded("no backend available", reason="no_backend")
                if last is not None:
                    self._observer.retry(last.reason)
                return await self._call(admitted, tried, path, body, request_id, deadline,
                                        decode, attempt)
            except Retryable as exc:
                last = exc
            finally:
                if attempt > 1:
                    self.budget.release()
            attempt += 1
        if isinstance(last.error, Overloaded):
            self._shed(last.error.reason)
        raise last.error

    async def _admit(
        self, deadline: float, exclude: Sequence[BackendState], who: _Who = (PUBLIC, INTERACTIVE)
    ) -> tuple[BackendState, Slot] | None:
        """A backend and a slot in its tier, trying farther tiers while a near one sheds."""
        skipped: set[str] = set()
        refusal: Overloaded | None = None
        while True:
            allowed = {t for t, _ in self._router.tiers()} - skipped
            state = self._router.pick(exclude, tiers=allowed)
            if state is None:
                if refusal is not None:
                    self._shed(refusal.reason)
                    raise refusal
                return None
            tier = self._router.tier_of(state)
            try:
                slot = await self._admission.acquire(tier, deadline=deadline, record_shed=False,
                                                     tenant=who[0], priority=who[1])
            except Overloaded as exc:
                refusal = refusal or exc
                skipped.add(tier)
                continue
            if slot.waited:
                # Load and health moved while we queued: choose again within the tier.
                again = self._router.pick(exclude, tiers={tier})
                if again is None:
                    slot.release(observe=False)
                    skipped.add(tier)
                    continue
                state = again
            return state, slot

    async def _call(
        self, admitted: tuple[BackendState, Slot], tried: list[BackendState], path: str,
        body: bytes, request_id: str, deadline: float, decode: Callable[[_Reply], T],
        attempt: int,
    ) -> T:
        state, slot = admitted
        tried.append(state)
        send = _Send(path, body, request_id, deadline, attempt)
        hedge_delay = self._hedge.delay(self._router.tier_of(state)) if self._hedge else None
        if hedge_delay is None:
            return await self._attempt(state, slot, send, decode)
        slots = [slot]

        def spawn_hedge() -> Coroutine[Any, Any, T] | None:
            second = self._router.pick(tried)
            if second is None:
                return None
            hedge_slot = self._admission.try_acquire(self._router.tier_of(second),
                                                     tenant=slot.tenant)
            if hedge_slot is None:  # a hedge only ever uses spare capacity
                return None
            tried.append(second)
            slots.append(hedge_slot)
            self._observer.hedge()
            return self._attempt(second, hedge_slot, send, decode)

        try:
            return await race(self._attempt(state, slot, send, decode), hedge_delay, spawn_hedge)
        finally:
            for held in slots:  # a copy cancelled before it ran never released its slot
                held.release(observe=False)

    async def _attempt(
        self, state: BackendState, slot: Slot, send: _Send, decode: Callable[[_Reply], T],
    ) -> T:
        """One try at one backend; owns ``slot`` and the router's in-flight count for it."""
        self._router.on_start(state)
        start = self._clock()
        outcome: BackendResult = "cancelled"
        try:
            left = send.deadline - start
            if left <= 0:
                raise DeadlineExceeded("deadline passed before the request reached a backend")
            per_try = self._settings.per_try_timeout_s
            allowed = min(left, per_try)  # this try's time: the per-try timeout, or less
            headers = {
                "Content-Type": "application/json", "X-Request-Id": send.request_id,
                "X-Request-Timeout-Ms": str(max(1, int(allowed * 1000))),
                "X-Attempt-Count": str(send.attempt),
            }
            scope = asyncio.timeout(allowed)
            try:
                async with scope:
                    sent = await self._transport.send(
                        Request("POST", state.url + send.path, send.body, headers),
                        timeout_s=per_try)
                reply = _Reply(sent.status, sent.body, sent.headers, state, self._clock() - start)
            except (TransportError, TimeoutError) as exc:
                # Past the deadline it is the client's time that ran out, not the backend's.
                deadline_passed = scope.expired() and left <= per_try
                outcome = classify_exception(exc, deadline_passed=deadline_passed)
                raise exception_error(state.name, outcome, exc) from None
            outcome, error = status_outcome(reply.status, reply.headers, reply.body, state.name)
            if error is not None:
                raise error
            try:
                value = decode(reply)
            except BadGateway:
                if reply.status == 200:  # a malformed success counts against the backend
                    outcome = "error"
                raise
            if self._hedge is not None and reply.status == 200:
                self._hedge.observe(self._router.tier_of(state), reply.latency_s)
            return value
        finally:
            latency = self._clock() - start
            self._router.on_finish(state, latency_s=latency, outcome=outcome)
            slot.release()
            self._observer.upstream_call(state.name, state.spec.zone, outcome, latency)

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

    def _shed(self, reason: str) -> None:
        self._observer.shed(reason)
