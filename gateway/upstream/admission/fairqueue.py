"""The admission queue's order: strict priority classes, then weighted fair shares by tenant.

A tier's waiters are kept per priority class (``interactive`` before ``batch``: a batch waiter
gets a slot only while no interactive one waits) and, inside a class, per tenant. Between the
tenants of a class the queue is self-clocked fair queuing (SCFQ, Golestani 1994), the
per-request form of weighted fair queuing:

- a waiter of tenant *t* arriving gets the finish tag ``F = max(V, last_t) + 1 / weight_t``,
  where ``V`` is the tag of the waiter served last in its class and ``last_t`` the tag of *t*'s
  newest waiter;
- ``pop`` serves the waiter with the smallest tag; on a tie, the tenant holding fewer slots
  (a tenant with a backlog and one that just arrived often tie: the newcomer goes first), then
  the tenant that waited first.

So a tenant with a backlog advances its own tags by ``1 / weight`` per waiter while a tenant
that sends now and then starts from ``V``: it is served within about one turn of every other
busy tenant, whatever their backlog. Within one tenant the order is FIFO.

When the queue is full, ``victim`` picks whom to shed for a newcomer: a batch waiter for an
interactive newcomer if any waits; otherwise the newest waiter of the tenant furthest over its
share (usage = slots held + waiters, over its weight), if that tenant is further over than the
newcomer's tenant would be with the newcomer; else nobody (the newcomer is shed). Pure data
structure: no clock, no asyncio; ``Admission`` (gateway/upstream/admission/control.py) drives it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, Literal, TypeVar

T = TypeVar("T")

Priority = Literal["interactive", "batch"]
INTERACTIVE: Priority = "interactive"
BATCH: Priority = "batch"
PRIORITIES: tuple[Priority, ...] = (INTERACTIVE, BATCH)
"""Priority classes, served in this order."""


def lower(a: Priority, b: Priority) -> Priority:
    """The lower of two priority classes (a batch tenant's requests stay batch)."""
    return BATCH if BATCH in (a, b) else INTERACTIVE


class _Flow(Generic[T]):
    __slots__ = ("items", "last")

    def __init__(self) -> None:
        self.items: collections.deque[tuple[float, T]] = collections.deque()
        self.last = 0.0


class _Class(Generic[T]):
    __slots__ = ("flows", "size", "vtime")

    def __init__(self) -> None:
        self.flows: dict[str, _Flow[T]] = {}  # insertion order: who waited first
        self.size = 0  # waiters of the class, all tenants
        self.vtime = 0.0


class FairQueue(Generic[T]):
    """Waiters by priority class and tenant (see the module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[Priority, _Class[T]] = {p: _Class() for p in PRIORITIES}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for cls in self._classes.values():
            for flow in cls.flows.values():
                for _, item in flow.items:
                    yield item

    def waiting(self, priority: Priority) -> bool:
        """Whether any waiter of the class waits."""
        return bool(self._classes[priority].flows)

    def depth(self, priority: Priority) -> int:
        """How many waiters of the class wait."""
        return self._classes[priority].size

    def queued(self, priority: Priority | None = None) -> dict[str, int]:
        """Waiters per tenant (of one class, or of all)."""
        out: dict[str, int] = {}
        for p, cls in self._classes.items():
            if priority is None or p == priority:
                for tenant, flow in cls.flows.items():
                    out[tenant] = out.get(tenant, 0) + len(flow.items)
        return out

    def queued_of(self, tenant: str, priority: Priority) -> int:
        """How many waiters of ``tenant`` wait in the class."""
        flow = self._classes[priority].flows.get(tenant)
        return len(flow.items) if flow is not None else 0

    def _tag(self, cls: _Class[T], tenant: str, weight: float) -> float:
        flow = cls.flows.get(tenant)
        last = flow.last if flow is not None else 0.0
        return max(cls.vtime, last) + 1.0 / weight

    def push(self, item: T, *, tenant: str, priority: Priority, weight: float) -> None:
        """Add a waiter (``weight`` > 0: the tenant's share relative to the others)."""
        cls = self._classes[priority]
        tag = self._tag(cls, tenant, weight)
        flow = cls.flows.get(tenant)
        if flow is None:
            flow = cls.flows[tenant] = _Flow()
        flow.items.append((tag, item))
        flow.last = tag
        cls.size += 1
        self._len += 1

    def pop(self, usage: Mapping[str, int] | None = None,
            only: Priority | None = None) -> T | None:
        """The next waiter to serve, removed; None when empty. ``usage``: slots each tenant
        holds (breaks ties); ``only``: serve that class alone (None: any, in order)."""
        held = usage or {}
        for p, cls in self._classes.items():
            if only is not None and p != only:
                continue
            best: _Flow[T] | None = None
            best_tenant = ""
            best_key = (0.0, 0)
            for tenant, flow in cls.flows.items():
                key = (flow.items[0][0], held.get(tenant, 0))
                if best is None or key < best_key:
                    best, best_tenant, best_key = flow, tenant, key
            if best is not None:
                tag, item = best.items.popleft()
                cls.vtime = max(cls.vtime, tag)
                if not best.items:
                    del cls.flows[best_tenant]
                cls.size -= 1
                self._len -= 1
                return item
        return None

    def remove(self, item: T) -> bool:
        """Take a waiter out (it left: cancelled, deadline); False when it is not here."""
        for cls in self._classes.values():
            for tenant, flow in cls.flows.items():
                for i, (_, queued) in enumerate(flow.items):
                    if queued is item:
                        del flow.items[i]
                        if not flow.items:
                            del cls.flows[tenant]
                        cls.size -= 1
                        self._len -= 1
                        return True
        return False

    def ahead(self, *, tenant: str, priority: Priority, weight: float) -> int:
        """How many current waiters a newcomer of ``tenant`` would be served after."""
        count = 0
        for p, cls in self._classes.items():
            if p != priority:
                if p == INTERACTIVE:  # a batch newcomer waits for every interactive waiter
                    count += sum(len(f.items) for f in cls.flows.values())
                continue
            tag = self._tag(cls, tenant, weight)
            for flow in cls.flows.values():
                count += sum(1 for t, _ in flow.items if t <= tag)
        return count

    def victim(self, *, tenant: str, priority: Priority, weight_of: Callable[[str], float],
               usage: Mapping[str, int]) -> T | None:
        """Whom to shed so a newcomer of ``tenant`` can wait (still queued: ``remove`` it), or
        None when the newcomer itself is the one to shed. ``usage``: slots each tenant holds;
        ``weight_of``: each tenant's weight now (a reload may have changed it)."""
        if priority == INTERACTIVE and self._classes[BATCH].flows:
            return self._worst(self._classes[BATCH], usage, weight_of, None, None)
        cls = self._classes[priority]
        own = cls.flows.get(tenant)
        mine = (usage.get(tenant, 0) + (len(own.items) if own else 0) + 1) / weight_of(tenant)
        return self._worst(cls, usage, weight_of, mine, tenant)

    @staticmethod
    def _worst(cls: _Class[T], usage: Mapping[str, int], weight_of: Callable[[str], float],
               bar: float | None, exclude: str | None) -> T | None:
        """The newest waiter (the least time spent waiting) of the tenant furthest over its
        share, if it is further over than ``bar``."""
        worst: tuple[float, _Flow[T]] | None = None
        for tenant, flow in cls.flows.items():
            if tenant != exclude:
                over = (usage.get(tenant, 0) + len(flow.items)) / weight_of(tenant)
                if worst is None or over > worst[0]:
                    worst = (over, flow)
        if worst is None or (bar is not None and worst[0] <= bar):
            return None
        return worst[1].items[-1][1]
