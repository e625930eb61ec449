"""The limits' arithmetic: GCRA for rates, a per-UTC-day counter for budgets. Pure functions.

GCRA (the generic cell rate algorithm, as in ATM and in redis-cell) keeps one number per
limit, the theoretical arrival time ``tat``: when the limit would be whole again if nothing
more came. A limit of ``per_s`` with ``burst`` lets a charge of ``cost`` through at ``now``
when ``max(tat, now) + cost / per_s - burst / per_s <= now``, and then moves ``tat`` by
``cost / per_s``. It is exact (no window edges), needs one value per tenant and limit, and is
the same computation in Python (the local limiter) and in Lua (gateway/tenants/quota/script.lua, the
shared limiter). A charge larger than the burst passes when the limit is whole and leaves the
tenant in debt for the rest, so a big request is slowed, never refused for good.

A daily budget counts what was charged since 00:00 UTC and refuses a charge that would pass it.
A charge of 0 only reads (what the ``RateLimit`` header reports for a limit not charged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

DAY_S = 86400.0
_EPS = 1e-9

Kind = Literal["rate", "day"]


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit of a tenant: a rate with a burst, or a daily budget."""

    name: str
    """``requests``, ``texts`` or ``daily``: the policy name in the RateLimit headers."""
    kind: Kind
    amount: float
    """Per second (``rate``) or per UTC day (``day``)."""
    burst: int = 0
    """How much may come at once (``rate`` only)."""

    @property
    def window_s(self) -> int:
        """The window the ``RateLimit-Policy`` header states: a burst's worth of the rate."""
        if self.kind == "day":
            return int(DAY_S)
        return max(1, round(self.burst / self.amount))

    @property
    def quota(self) -> int:
        """The quota the ``RateLimit-Policy`` header states (``q``)."""
        return self.burst if self.kind == "rate" else int(self.amount)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one limit said to one charge."""

    allowed: bool
    remaining: int
    """Units left after this charge (before it, when refused)."""
    reset_s: float
    """Until the limit is whole again (a rate) or the day ends (a budget)."""
    retry_s: float
    """Until this charge would pass (0 when allowed)."""


def rate(limit: Limit, tat: float, now: float, cost: float) -> tuple[Verdict, float]:
    """A GCRA step: the verdict and the new ``tat`` (unchanged when refused or when cost 0)."""
    interval = 1.0 / limit.amount
    tat = max(tat, now)
    new_tat = tat + cost * interval
    allow_at = new_tat - limit.burst * interval
    if now + _EPS >= allow_at or (cost > 0 and tat <= now):
        remaining = max(0, math.floor((now - allow_at) / interval + _EPS))
        return Verdict(True, remaining, new_tat - now, 0.0), new_tat
    remaining = max(0, math.floor((now - tat) / interval + limit.burst + _EPS))
    return Verdict(False, remaining, tat - now, allow_at - now), tat


def day_of(now: float) -> int:
    """The UTC day number of a Unix time."""
    return int(now // DAY_S)


def daily(limit: Limit, used: float, now: float, cost: float) -> tuple[Verdict, float]:
    """A budget step: the verdict and the new amount used today (``used`` is today's)."""
    reset = (day_of(now) + 1) * DAY_S - now
    if cost > 0 and used + cost > limit.amount + _EPS:
        return Verdict(False, max(0, math.floor(limit.amount - used)), reset, reset), used
    return Verdict(True, max(0, math.floor(limit.amount - used - cost + _EPS)), reset,
                   0.0), used + cost
