"""A tier's admission state and the slot a granted call holds, under ``Admission`` (control.py).

``_TierQueue`` is one tier's counts (slots in flight, per tenant), its fair wait queue of
``_Waiter`` and its service-time EWMA; ``Slot`` is the permission to make one upstream call,
given back exactly once to its owner (``Admission``, seen here only through ``_Owner`` so that
this module does not import control.py). ``PUBLIC`` is the tenant of a call that names none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from gateway.upstream.admission.adaptive import GradientLimit
from gateway.upstream.admission.fairqueue import FairQueue

# the tenant of a call that names none (gateway/tenants/directory.py uses the same id)
PUBLIC = "public"


class _Owner(Protocol):
    """What a ``Slot`` needs of the ``Admission`` that granted it."""

    clock: Callable[[], float]

    def observe(self, service_time_s: float, *, tier: str | None = None,
                epoch: int | None = None) -> None: ...

    def _release(self, tier: str, tenant: str = PUBLIC, batch: bool = False) -> None: ...


class _TierQueue:
    __slots__ = ("active", "adaptive", "batch_active", "ewma_s", "grants", "holders", "samples",
                 "waiters")

    def __init__(self, adaptive: GradientLimit | None, grants: GrantRates | None = None) -> None:
        self.active = 0
        self.batch_active = 0  # of ``active``: slots held by batch-class calls
        self.adaptive = adaptive
        self.waiters: FairQueue[_Waiter] = FairQueue()
        self.holders: dict[str, int] = {}  # tenant -> slots held now
        self.ewma_s = 0.0
        self.samples = 0
        self.grants = grants
        """Interactive slots granted per tenant lately (``admission.express`` only)."""

    def hold(self, tenant: str, batch: bool = False) -> None:
        self.active += 1
        self.batch_active += batch
        self.holders[tenant] = self.holders.get(tenant, 0) + 1
        if self.grants is not None and not batch:
            self.grants.add(tenant)

    def unhold(self, tenant: str, batch: bool = False) -> None:
        self.active -= 1
        self.batch_active -= batch
        left = self.holders.get(tenant, 0) - 1
        if left > 0:
            self.holders[tenant] = left
        else:
            self.holders.pop(tenant, None)


class GrantRates:
    """Slots granted per tenant over the last two windows of ``window_s`` (the one running and
    the one before it): what share of a tier's calls each tenant has been taking lately, a
    measure a flood cannot move by holding slots longer (``Admission._quiet``)."""

    __slots__ = ("clock", "current", "current_total", "ends", "previous", "previous_total",
                 "window_s")

    def __init__(self, clock: Callable[[], float], window_s: float = 1.0) -> None:
        self.clock = clock
        self.window_s = window_s
        self.current: dict[str, int] = {}
        self.previous: dict[str, int] = {}
        self.current_total = 0
        self.previous_total = 0
        self.ends = clock() + window_s

    def _roll(self) -> None:
        now = self.clock()
        if now < self.ends:
            return
        if now < self.ends + self.window_s:
            self.previous, self.previous_total = self.current, self.current_total
        else:  # a whole window with no grant: what came before it is no longer lately
            self.previous, self.previous_total = {}, 0
        self.current, self.current_total = {}, 0
        self.ends = now + self.window_s

    def add(self, tenant: str) -> None:
        self._roll()
        self.current[tenant] = self.current.get(tenant, 0) + 1
        self.current_total += 1

    def share(self, tenant: str) -> tuple[int, int, set[str]]:
        """(``tenant``'s grants, all grants, the tenants granted any) over both windows."""
        self._roll()
        mine = self.current.get(tenant, 0) + self.previous.get(tenant, 0)
        return mine, self.current_total + self.previous_total, {*self.current, *self.previous}


class _Waiter:
    __slots__ = ("batch", "future", "tenant")

    def __init__(self, future: asyncio.Future[None], tenant: str, batch: bool = False) -> None:
        self.future = future
        self.tenant = tenant
        self.batch = batch


class Slot:
    """Permission to make one upstream call in a tier; release it exactly once (idempotent).

    Usable as ``async with await admission.acquire(...)``, or call ``release()``.
    """

    __slots__ = ("_admission", "_epoch", "_granted_at", "_released", "batch", "queued_s",
                 "tenant", "tier")

    def __init__(self, admission: _Owner, tier: str, granted_at: float, queued_s: float,
                 epoch: int = 0, tenant: str = PUBLIC, batch: bool = False):
        self._admission = admission
        self.batch = batch
        self._epoch = epoch
        self._granted_at = granted_at
        self._released = False
        self.tier = tier
        self.queued_s = queued_s
        self.tenant = tenant

    @property
    def waited(self) -> bool:
        """True when the request had to queue for this slot."""
        return self.queued_s > 0.0

    def release(self, *, observe: bool = True) -> None:
        """Give the slot back (to the next waiter, if any) and record how long it was held.

        ``observe=False`` for a slot given back unused, which says nothing of service time.
        """
        if not self._released:
            self._released = True
            if observe:
                self._admission.observe(self._admission.clock() - self._granted_at,
                                        tier=self.tier, epoch=self._epoch)
            self._admission._release(self.tier, self.tenant, self.batch)

    async def __aenter__(self) -> Slot:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
