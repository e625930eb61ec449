"""Batch lines and the tenant's quotas: charged exactly like interactive calls, never free.

A line is one request of its tenant: ``QuotaState.admit`` charges it against
``requests_per_s``, and the pipeline charges its texts through ``RequestContext.charge`` once
hits are told from misses (texts going to a backend, plus ``quotas.hit_cost`` per cached text,
against ``texts_per_s`` and ``texts_per_day``), the same two calls the HTTP handlers make
(gateway/http/serve.py). A refused charge computes nothing and raises ``OverQuota``.

What the worker then does with the line (``plan``), by when the charge would pass:

- ``sleep``: within ``batch.retry_max_s`` (a per-second rate refilling): the line waits that
  long, off the gate, and tries again;
- ``defer``: later, but before the batch's completion window ends (a daily budget spent, a
  long refill): its chunk leaves the queue and comes back when the charge can pass
  (gateway/batch/worker.py), so a tenant out of budget holds no worker meanwhile;
- ``fail``: never within the window (the budget resets after it ends, or the line alone costs
  more than a whole daily budget): the line ends at once as an error line with code
  ``quota_exceeded``, in the batch's error file.
"""

from __future__ import annotations

from typing import Literal

from gateway.errors import RateLimited
from gateway.tenants.quota.limiter import QuotaState

QUOTA_EXCEEDED = "quota_exceeded"
"""The error line's code for a line its tenant's quota leaves no room for in its window."""

Plan = Literal["sleep", "defer", "fail"]


class OverQuota(Exception):
    """A line's charge was refused: nothing was computed. ``retry_s``: until the charge would
    pass; ``never``: it cannot pass on any day (the line costs more than a daily budget);
    ``line``: the error line to record if the window cannot be met."""

    def __init__(self, error: RateLimited, *, never: bool, line: bytes) -> None:
        super().__init__(error.type)
        self.retry_s = error.retry_after_s
        self.never = never
        self.line = line


class LineCharge:
    """``RequestContext.charge`` for one line: the tenant's charge, and whether what it was
    refused could ever pass (a cost above a daily budget cannot)."""

    __slots__ = ("_hit_cost", "_quota", "cost")

    def __init__(self, quota: QuotaState, hit_cost: float) -> None:
        self._quota = quota
        self._hit_cost = hit_cost
        self.cost = 0.0

    async def __call__(self, backend_texts: int, cached_texts: int) -> None:
        self.cost = backend_texts + cached_texts * self._hit_cost
        await self._quota.charge(backend_texts, cached_texts)

    @property
    def never(self) -> bool:
        return any(limit.kind == "day" and self.cost > limit.amount
                   for limit in self._quota.texts)


def reason(error: RateLimited, never: bool) -> str:
    """The error line's message: which limit, and why waiting cannot help."""
    which = error.public_message.split(";", 1)[0]
    if never:
        return f"{which}; this line alone costs more than the whole daily budget"
    return f"{which}; the quota has no room for this line before the batch's window ends"


def plan(over: OverQuota, *, now: float, expires_at: float, sleep_max_s: float) -> Plan:
    """What the worker does with a refused line (see the module docstring)."""
    if over.never or now + over.retry_s > expires_at:
        return "fail"
    if over.retry_s <= sleep_max_s:
        return "sleep"
    return "defer"
