"""The local limiter: the same limits kept in this process, for when Redis cannot answer.

Used when no Redis is configured and, with one, for each check Redis could not answer in time
(down, slow, circuit open): quotas then fail open to a per-process limit instead of refusing
everyone or letting everyone through. Each process enforces ``fraction`` of every limit
(``quotas.local_fraction``: 1/N for N processes keeps the gateway's total near the limit).
State is one number per tenant and limit, bounded by the tenants in the file; entries of limits
that are whole again are dropped when the table grows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gateway.tenants.quota.gcra import Limit, Verdict, daily, day_of, rate

Charge = tuple[Limit, float]
"""A limit and what to charge it (0: only read it)."""

_PRUNE_AT = 10_000


class LocalLimiter:
    """Per-process GCRA state and daily counters (see the module docstring)."""

    def __init__(self, *, fraction: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._fraction = fraction
        self._clock = clock
        self._tats: dict[tuple[str, str], float] = {}
        self._days: dict[str, tuple[int, float]] = {}

    def _scaled(self, limit: Limit) -> Limit:
        if self._fraction == 1.0:
            return limit
        return replace(limit, amount=limit.amount * self._fraction,
                       burst=max(1, round(limit.burst * self._fraction)))

    def apply(self, tenant: str, charges: Sequence[Charge]) -> list[Verdict]:
        """Every limit's verdict; charged all together only when every one allows."""
        now = self._clock()
        verdicts: list[Verdict] = []
        updates: list[tuple[str, float]] = []
        for limit, cost in charges:
            local = self._scaled(limit)
            if local.kind == "rate":
                verdict, tat = rate(local, self._tats.get((tenant, limit.name), 0.0), now, cost)
                updates.append((limit.name, tat))
            else:
                day, used = self._days.get(tenant, (day_of(now), 0.0))
                verdict, used = daily(local, used if day == day_of(now) else 0.0, now, cost)
                updates.append(("", used))
            verdicts.append(verdict)
        if all(v.allowed for v in verdicts):
            for name, value in updates:
                if name:
                    self._tats[(tenant, name)] = value
                else:
                    self._days[tenant] = (day_of(now), value)
            if len(self._tats) > _PRUNE_AT:
                self._tats = {k: t for k, t in self._tats.items() if t > now}
        return verdicts
