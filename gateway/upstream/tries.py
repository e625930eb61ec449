"""The per-try machinery under ``Upstream`` (client.py): tries, retries, admission, hedging.

``Tries`` is the base ``Upstream`` builds on: ``_tries`` runs the first try and the retries the
policy, the deadline, an untried backend and the retry budget allow; ``_admit`` finds a backend
and a slot in its tier (failing over to farther tiers while a near one sheds); ``_call`` sends
one try, with a hedged second copy when the tier's p95 says so; ``_attempt`` is one try at one
backend, with the headers, the per-try timeout and the answer's checks. ``_Send`` and
``_Reply`` are the values passed between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.routing.backends import BackendState
from gateway.routing.balancer import BackendResult, Router
from gateway.routing.config import RoutingSettings
from gateway.routing.hedge import HedgePolicy, race
from gateway.telemetry.observer import Observer
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.fairqueue import INTERACTIVE, Priority
from gateway.upstream.admission.slots import PUBLIC, Slot
from gateway.upstream.retry import RetryBudget, RetryPolicy
from gateway.upstream.transport import Request, Transport, TransportError
from gateway.upstream.wire import (
    Retryable,
    classify_exception,
    exception_error,
    status_outcome,
)

T = TypeVar("T")
_SERVICE_SAMPLES = frozenset({"ok", "timeout"})
"""Outcomes whose latency is a service time (``Slot.release``'s ``observe``)."""
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

class Tries:
    """The tries of one backend call; ``Upstream`` sets the parts in its ``__init__``."""

    _transport: Transport
    _router: Router
    _admission: Admission
    _settings: RoutingSettings
    _observer: Observer
    _clock: Callable[[], float]
    _hedge: HedgePolicy | None
    _policy: RetryPolicy
    budget: RetryBudget

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
                    sent = await self._transport.send(  # ``scope`` bounds it (to per_try)
                        Request("POST", state.url + send.path, send.body, headers),
                        timeout_s=per_try, bounded=True)
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
            # Only an answer (or a try that ran out of time) says how long the backend takes:
            # a refusal (503), a failure or a cancelled try ends fast, and fed to the service
            # time and the adaptive limit it would make the queue look short just when the
            # backend is refusing (a deadline burst then sent ~100 calls to be refused).
            slot.release(observe=outcome in _SERVICE_SAMPLES)
            self._observer.upstream_call(state.name, state.spec.zone, outcome, latency)
    def _shed(self, reason: str) -> None:
        self._observer.shed(reason)
