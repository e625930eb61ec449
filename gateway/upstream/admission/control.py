"""Admission control: a concurrency limit and a bounded, fair wait queue per backend tier.

A request either gets a slot at once, waits in its tier's queue, or is shed at once:

- ``queue_full``: the queue is at ``tier_queue`` and the request's tenant is the one furthest
  over its share; 503 with ``Retry-After`` (the queue's expected drain time), so overload costs
  a client microseconds rather than a timeout.
- ``fair_share``: the queue was full and this waiter's tenant the furthest over its share, so it
  made room for a newcomer of a tenant under its share (or of a higher priority class).
- ``deadline``: the expected wait (position in the fair order / concurrency x the tier's recent
  slot-hold time) already exceeds the time the request has left; shedding now beats timing out
  later.
- ``wait``: an interactive request's expected wait exceeds ``max_wait_factor`` times the tier's
  recent slot-hold time and its tenant, with it, would hold and wait for more than its weighted
  share of the limit (``_over_share``): under overload the surplus is told at once, and what is
  admitted waits about as long as it would at moderate load; a tenant under its share is not
  shed for another's backlog (batch-class calls wait up to their deadline; no
  bound before the adaptive limit's first minRTT probe has ended, when the limit is the floor
  rather than anything learned; later probes are bounded, reckoned at the probe's limit).
- ``expired``: the deadline passed while the request was queued; it leaves the queue (504) and
  never reaches a backend.

While a tenant's last call had to queue or was shed, ``refuse_early`` makes the same decision
for its next requests as they are read (gateway/http/gate.py) or before their policy and
lookups (gateway/http/serve.py); both hold the 503s of ``wait`` and ``queue_full`` for
``refusal_hold_s``. An interactive call of a tenant that holds
no slot in the tier, or holds fewer than its share, gets one at once while the other
tenants' slots stay within the limit plus the interactive reserve (``_now``).

The queue is not FIFO across tenants (gateway/upstream/admission/fairqueue.py): ``interactive``
waiters go before ``batch`` ones, and batch-class calls hold at most the limit less a quarter
of it (one slot at least is kept for interactive calls, which batch calls waiting in a backend
behind interactive ones would otherwise hold); between the tenants of a class each gets slots
in proportion to its weight (tenants file, ``weight``), so one tenant's flood cannot starve
the others. A request's class is the lower of the caller's ``priority`` (batch jobs pass
``batch``) and its tenant's class.

Memory stays bounded: the queue never holds more than ``tier_queue`` waiters per tier. Each
tier's service time is an EWMA of how long slots are held, fed by ``Slot.release``.

What it reports (``Observer``): the queue's depth per class and the calls in flight after every
change (``gateway_queue_depth{tier,class}``, ``gateway_upstream_inflight{tier}``), and for every
call that queued how long it waited and how that ended (``gateway_queue_wait_seconds{tier,
class,outcome}``: ``granted``, or it left the queue ``shed``, ``expired``, ``cancelled``). A call
granted at once or shed at once waited for nothing and is not observed there (the shed ones
are in ``gateway_shed_total``): a miss that does not queue pays no histogram update.

The limit is a per-tier ``GradientLimit`` (gateway/upstream/admission/adaptive.py, on by
default) moving under the ceiling ``tier_concurrency`` with the latency the tier's calls show, so
that what the backends cannot use waits here, in fair order, rather than in their FIFO; when it
rises, queued requests are granted at once. With ``adaptive.enabled: false`` the limit is
``tier_concurrency``. ``AdmissionSettings`` (settings.py) is the settings
section ``admission``; a tier's state and the ``Slot`` live in slots.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.errors import DeadlineExceeded, Overloaded
from gateway.telemetry.observer import NullObserver, Observer
from gateway.upstream.admission.adaptive import GradientLimit
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, Priority, lower
from gateway.upstream.admission.settings import AdmissionSettings
from gateway.upstream.admission.slots import PUBLIC, GrantRates, Slot, _TierQueue, _Waiter

_ALPHA = 0.2  # weight of the newest service-time sample
#: ``express``: a tenant is judged quiet on the grants of the last two windows of this length,
#: and only once the tier has granted at least ``_QUIET_EVIDENCE`` calls in them.
_RATE_WINDOW_S = 1.0
_QUIET_EVIDENCE = 20

def _interactive_reserve(limit: int) -> int:
    """Slots batch-class calls leave to interactive ones: a quarter of the limit, at least one
    (none at a limit of 1, where batch would otherwise never run)."""
    return max(1, limit // 4) if limit > 1 else 0


def _left(exc: BaseException) -> str:
    """Why a waiter left the queue without a slot (the ``outcome`` of its wait)."""
    if isinstance(exc, TimeoutError):
        return "expired"
    return "shed" if isinstance(exc, Overloaded) else "cancelled"


Share = Callable[[str], tuple[float, Priority]]
"""A tenant's fair-share weight and priority class (gateway/tenants/store.py, from the tenants
file; read on every call, so a reload applies at once)."""


def equal_share(tenant: str) -> tuple[float, Priority]:
    """Every tenant weight 1, interactive: what runs without a tenants file."""
    return 1.0, INTERACTIVE


class Admission:
    """Per-tier concurrency limit, bounded fair queue and deadline-aware shedding."""

    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
        share: Share = equal_share,
    ) -> None:
        self._limit = settings.tier_concurrency
        self._queue_limit = settings.tier_queue
        self._adaptive = settings.adaptive if settings.adaptive.enabled else None
        self._max_wait_factor = settings.max_wait_factor
        self._express = settings.express
        self._observer: Observer = observer or NullObserver()
        self.clock = clock
        self._share = share
        self._tiers: dict[str, _TierQueue] = {}
        self._backlogs: dict[str, str] = {}
        """Per tenant whose last call did not get a slot at once: the tier it was judged in
        (``refuse_early`` judges its next requests there)."""

    def _tier(self, tier: str) -> _TierQueue:
        state = self._tiers.get(tier)
        if state is None:
            adaptive = None if self._adaptive is None else GradientLimit(
                self._adaptive, self._limit, clock=self.clock)
            grants = GrantRates(self.clock, _RATE_WINDOW_S) if self._express else None
            state = self._tiers[tier] = _TierQueue(adaptive, grants)
            self._limit_gauge(tier, state)
        return state

    def _limit_of(self, state: _TierQueue) -> int:
        return self._limit if state.adaptive is None else state.adaptive.limit

    def limit(self, tier: str) -> int:
        """``tier``'s concurrency limit now (``tier_concurrency`` unless adaptive)."""
        return self._limit_of(self._tier(tier))

    def adaptive(self, tier: str) -> GradientLimit | None:
        """``tier``'s adaptive limit controller, or None when the limit is fixed."""
        return self._tier(tier).adaptive

    def queue_depth(self, tier: str) -> int:
        """Requests waiting in ``tier``'s queue now."""
        return len(self._tier(tier).waiters)

    def inflight(self, tier: str) -> int:
        """Slots held in ``tier`` now."""
        return self._tier(tier).active

    def tenants(self, tier: str) -> dict[str, tuple[int, int]]:
        """Per tenant in ``tier`` now: (slots held, requests waiting)."""
        state = self._tier(tier)
        queued = state.waiters.queued()
        return {t: (state.holders.get(t, 0), queued.get(t, 0))
                for t in sorted(set(state.holders) | set(queued))}

    def service_time_s(self, tier: str) -> float:
        """The tier's recent slot-hold time (EWMA); 0 before the first sample."""
        return self._tier(tier).ewma_s

    def _drain_s(self, state: _TierQueue, position: int) -> float:
        return position / self._limit_of(state) * state.ewma_s

    def _weight(self, tenant: str) -> float:
        return self._share(tenant)[0]

    def _class(self, tenant: str, priority: Priority) -> tuple[float, Priority]:
        weight, tenant_class = self._share(tenant)
        return weight, lower(priority, tenant_class)

    def check(self, tier: str, *, deadline: float, tenant: str = PUBLIC,
              priority: Priority = INTERACTIVE) -> Overloaded | None:
        """Why ``acquire`` would shed now, or None if it would admit or queue (a full queue
        that would shed another tenant's waiter to make room counts as queueing). No side
        effects."""
        weight, cls = self._class(tenant, priority)
        return self._decide(tier, self._tier(tier), deadline, tenant, weight, cls)[0]

    def _decide(self, tier: str, state: _TierQueue, deadline: float, tenant: str,
                weight: float, cls: Priority) -> tuple[Overloaded | None, _Waiter | None]:
        """(why to shed the newcomer, or None; the waiter to shed to make room for it);
        ``weight`` and ``cls``: its tenant's share and its class (``_class``)."""
        if self._now(state, cls, tenant):
            return None, None
        queued = len(state.waiters)
        victim = None
        if queued >= self._queue_limit:
            if self._queue_limit:
                victim = state.waiters.victim(tenant=tenant, priority=cls,
                                              weight_of=self._weight, usage=state.holders)
            if victim is None:
                return Overloaded(f"upstream queue for tier {tier!r} is full",
                                  reason="queue_full",
                                  retry_after_s=self._drain_s(state, queued)), None
        ahead = state.waiters.ahead(tenant=tenant, priority=cls, weight=weight)
        wait = self._drain_s(state, ahead + 1)
        now = self.clock()
        # No bound before the first minRTT probe has ended: the limit starts at the floor,
        # not at anything learned, and a start-up burst is not overload.
        learning = state.adaptive is not None and not state.adaptive.min_rtt_s
        bound = (self._max_wait_factor * state.ewma_s
                 if cls == INTERACTIVE and not learning else 0.0)
        if wait > deadline - now:
            return Overloaded(f"expected wait {wait * 1000:.0f} ms exceeds the request deadline",
                              reason="deadline", retry_after_s=wait), None
        if bound and wait > bound and self._over_share(state, tenant, weight, cls):
            return Overloaded(f"expected wait {wait * 1000:.0f} ms exceeds "
                              f"{self._max_wait_factor:g} x the tier's service time "
                              f"({state.ewma_s * 1000:.0f} ms)", reason="wait",
                              retry_after_s=wait - bound), None
        return None, victim

    def _over_share(self, state: _TierQueue, tenant: str, weight: float,
                    cls: Priority, limit: int | None = None) -> bool:
        """Whether ``tenant``, with one more call, would hold and wait for more than its
        weighted share of the tier's limit (or of ``limit``) among the tenants of the class
        holding or waiting there now. The wait bound sheds only such a tenant: one under its
        share is not what overloads the tier (the fair queue serves it next), and shedding it
        for the backlog of another would hand the other its place."""
        queued = state.waiters.queued(cls)
        active = set(queued)
        active.update(state.holders)
        active.add(tenant)
        total = sum(self._weight(t) for t in active)
        mine = state.holders.get(tenant, 0) + queued.get(tenant, 0) + 1
        return mine * total > (self._limit_of(state) if limit is None else limit) * weight

    def _quiet(self, state: _TierQueue, tenant: str, weight: float) -> bool:
        """``express``: whether ``tenant`` took less than its weighted share of the tier's
        interactive grants lately (``GrantRates``, two windows of ``_RATE_WINDOW_S``), among
        the tenants granted any. A flood's slower calls pull the learned limit down and with
        it every tenant's share of slots, so a tenant whose calls overlap (two in flight at
        60 a second of 10 ms each) looks over its share of slots; by its share of the calls
        it is quiet, and a lone flooding tenant (all the calls) never is."""
        grants = state.grants
        if grants is None:
            return False
        mine, total, tenants = grants.share(tenant)
        if total < _QUIET_EVIDENCE:
            return False
        tenants.add(tenant)
        weights = sum(self._weight(t) for t in tenants)
        return mine * weights < total * weight

    def quiet(self, tenant: str, priority: Priority = INTERACTIVE) -> bool:
        """``express``: whether a call of ``tenant`` goes to the backend marked for its express
        lane (schedule.py ``express``): an interactive call of a tenant whose last call got a
        slot at once. A tenant with calls queued here (a flood, or two tenants evenly busy
        past the limit) is not quiet: the backend would compute its texts alone beside the
        other's batch, at ~1.3x a text's share of a batch on a CPU."""
        return (self._express and tenant not in self._backlogs
                and self._class(tenant, priority)[1] == INTERACTIVE)  # a batch tenant's: never

    @property
    def backlogged(self) -> bool:
        """Whether some tenant's last call had to queue or was shed (``refuse_early`` may
        refuse its next ones): http/gate.py judges nothing while this is false."""
        return bool(self._backlogs)

    def refuse_early(self, tenant: str, deadline: float) -> Overloaded | None:
        """Why an interactive request of ``tenant`` would be shed, judged early (after its
        parse, before its policy, keys and lookups) by the decision ``acquire`` would make now
        in the tier where the tenant's last call had to queue or was shed; None to take the
        full path. A tenant whose last call got a slot at once, or whose tier has no waiter
        now, costs one dict read. Cache hits of a tenant refused here are refused too (its hot
        answers are served before this)."""
        tier = self._backlogs.get(tenant)
        if tier is None:
            return None
        state = self._tiers[tier]
        if not state.waiters:
            del self._backlogs[tenant]
            return None
        weight, cls = self._class(tenant, INTERACTIVE)
        return self._decide(tier, state, deadline, tenant, weight, cls)[0]

    def try_acquire(self, tier: str, *, tenant: str = PUBLIC) -> Slot | None:
        """A slot only if one is free right now (hedged copies never queue)."""
        state = self._tier(tier)
        if state.active >= self._limit_of(state) or state.waiters:
            return None
        return self._grant(tier, state, tenant, queued_s=0.0)

    async def acquire(self, tier: str, *, deadline: float, record_shed: bool = True,
                      tenant: str = PUBLIC, priority: Priority = INTERACTIVE) -> Slot:
        """A slot in ``tier`` for ``tenant``; queue for it until ``deadline`` (a ``clock``
        time) at most, in the fair order of the module docstring.

        Raises ``Overloaded`` at once when shed (or later, when shed from the queue to make
        room for a tenant under its share), ``DeadlineExceeded`` when the deadline passes first.
        ``record_shed=False`` leaves the shed metric to the caller (who may fail over to
        another tier instead).
        """
        start = self.clock()
        if deadline <= start:
            self._shed("expired")
            raise DeadlineExceeded("deadline passed before the request reached a backend")
        state = self._tier(tier)
        weight, cls = self._class(tenant, priority)
        refusal, victim = self._decide(tier, state, deadline, tenant, weight, cls)
        if refusal is not None:
            self._backlogs[tenant] = tier
            if record_shed:
                self._shed(refusal.reason)
            raise refusal
        batch = cls == BATCH
        if self._now(state, cls, tenant):
            if self._backlogs:
                self._backlogs.pop(tenant, None)
            return self._grant(tier, state, tenant, queued_s=0.0, batch=batch)
        if victim is not None:
            state.waiters.remove(victim)
            victim.future.set_exception(Overloaded(
                f"upstream queue for tier {tier!r} is full", reason="fair_share",
                retry_after_s=self._drain_s(state, len(state.waiters) + 1)))
        self._backlogs[tenant] = tier
        waiter = _Waiter(asyncio.get_running_loop().create_future(), tenant, batch)
        state.waiters.push(waiter, tenant=tenant, priority=cls, weight=weight)
        self._gauges(tier, state)
        try:
            async with asyncio.timeout(deadline - start):
                await waiter.future
        except BaseException as exc:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                # Granted in the same instant the deadline fired: pass the slot on.
                self._release(tier, tenant, batch)
            elif not future.done() or future.cancelled():
                future.cancel()
                state.waiters.remove(waiter)  # False when already popped by _wake
                self._gauges(tier, state)
            self._observer.queue_wait(tier, cls, _left(exc), self.clock() - start)
            if isinstance(exc, TimeoutError):
                self._shed("expired")
                raise DeadlineExceeded(
                    "deadline passed while waiting for a backend slot"
                ) from None
            if isinstance(exc, Overloaded) and record_shed:  # shed to make room for another
                self._shed(exc.reason)
            raise
        # _wake already counted this slot as held when it woke us.
        now = self.clock()
        self._observer.queue_wait(tier, cls, "granted", now - start)
        return Slot(self, tier, now, queued_s=max(now - start, 1e-9), epoch=self._epoch(state),
                    batch=batch,
                    tenant=tenant)

    def _now(self, state: _TierQueue, cls: Priority, tenant: str = PUBLIC) -> bool:
        """Whether a call of the class gets a slot at once: one is free to it and no waiter
        that would be served first waits (batch waiters held at their share do not count
        against an interactive call). An interactive call of a tenant under its share (one
        that holds no slot, or whose slots with this one stay within its weighted share of
        the limit, ``_over_share``) also gets one at once while the other tenants' slots stay
        within the limit plus the reserve kept for interactive calls: a quiet tenant goes
        straight to the backend, whose scheduler puts it before a flooding tenant's calls,
        instead of waiting for one of the flood's calls to end; its calls beyond the limit
        are bounded by its share. With ``express`` (a backend that computes such a call
        beside the batch in compute), a tenant holding no slot is bounded by the ceiling,
        ``tier_concurrency``, plus its reserve, instead of the learned limit, and so is one
        holding slots that took less than its weighted share of the tier's calls lately
        (``_quiet``), its own slots then bounded by its share of the ceiling."""
        if cls == BATCH:
            return not state.waiters and self._free(state, batch=True)
        if not state.waiters.waiting(INTERACTIVE) and self._free(state, batch=False):
            return True
        if state.waiters.queued_of(tenant, INTERACTIVE):
            return False
        held = state.holders.get(tenant, 0)
        limit = self._limit_of(state)
        if held:
            weight = self._weight(tenant)
            if self._express and self._quiet(state, tenant, weight):
                # Quiet by its share of the calls: its slots bounded by its share of the
                # ceiling, not of the learned limit the flood's slower calls pull down.
                if self._over_share(state, tenant, weight, INTERACTIVE, self._limit):
                    return False
                limit = max(limit, self._limit)
            elif self._over_share(state, tenant, weight, INTERACTIVE):
                return False
        elif self._express:
            limit = max(limit, self._limit)  # to a backend's express lane: the ceiling's bound
        # The tenant's own slots do not count: one under its share sends its next call while
        # its first computes, instead of waiting for one of the flood's calls to end.
        return state.active - held < limit + _interactive_reserve(limit)

    def _free(self, state: _TierQueue, batch: bool) -> bool:
        """Whether a call of the class may take a slot now: under the limit and, for a
        batch-class call, under the share left once slots are kept for interactive ones."""
        limit = self._limit_of(state)
        if state.active >= limit:
            return False
        return not batch or state.batch_active < limit - _interactive_reserve(limit)

    def _grant(self, tier: str, state: _TierQueue, tenant: str, *, queued_s: float,
               batch: bool = False) -> Slot:
        state.hold(tenant, batch)
        self._gauges(tier, state)
        return Slot(self, tier, self.clock(), queued_s=queued_s, epoch=self._epoch(state),
                    tenant=tenant, batch=batch)

    @staticmethod
    def _epoch(state: _TierQueue) -> int:
        return 0 if state.adaptive is None else state.adaptive.granted(state.active)

    def _release(self, tier: str, tenant: str = PUBLIC, batch: bool = False) -> None:
        state = self._tier(tier)
        state.unhold(tenant, batch)
        self._wake(state)
        self._gauges(tier, state)

    def _wake(self, state: _TierQueue) -> None:
        """Hands free slots to the next waiters in fair order (more than one when the limit
        rose)."""
        while state.waiters and state.active < self._limit_of(state):
            # Interactive waiters first (the queue's order); batch ones only within their share.
            only = None if self._free(state, batch=True) else INTERACTIVE
            waiter = state.waiters.pop(state.holders, only)
            if waiter is None:
                return
            if not waiter.future.done():
                waiter.future.set_result(None)
                state.hold(waiter.tenant, waiter.batch)

    def observe(self, service_time_s: float, *, tier: str | None = None,
                epoch: int | None = None) -> None:
        """Feed a slot-hold time into ``tier``'s EWMA (every known tier when None) and, for a
        call granted in adaptive ``epoch``, into the tier's adaptive limit."""
        targets = [self._tier(tier)] if tier is not None else list(self._tiers.values())
        for state in targets:
            state.ewma_s = service_time_s if not state.samples else (
                _ALPHA * service_time_s + (1.0 - _ALPHA) * state.ewma_s
            )
            state.samples += 1
        if tier is not None and epoch is not None:
            state = self._tier(tier)
            adaptive = state.adaptive
            if adaptive is not None:
                before = (adaptive.limit, adaptive.min_rtt_s)
                adaptive.observe(service_time_s, epoch)
                if (adaptive.limit, adaptive.min_rtt_s) != before:  # a probe may move minRTT only
                    self._limit_gauge(tier, state)
                if adaptive.limit != before[0]:
                    self._wake(state)
                    self._gauges(tier, state)

    def _shed(self, reason: str) -> None:
        self._observer.shed(reason)

    def _gauges(self, tier: str, state: _TierQueue) -> None:
        waiting = len(state.waiters)
        self._observer.admission(tier, waiting, state.active,
                                 state.waiters.depth(BATCH) if waiting else 0)

    def _limit_gauge(self, tier: str, state: _TierQueue) -> None:
        min_rtt = state.adaptive.min_rtt_s if state.adaptive is not None else None
        self._observer.concurrency_limit(tier, self._limit_of(state), min_rtt)
