"""What the worker does with a line its tenant's quota refuses (``gateway.batch.quota.plan``):
wait a moment, park its chunk until the charge can pass, or fail it when the window ends first."""

from __future__ import annotations

import pytest

from gateway.batch.quota import OverQuota, plan
from gateway.errors import RateLimited


def over(retry_s: float, *, never: bool = False) -> OverQuota:
    return OverQuota(RateLimited("quota exceeded: 5 texts per UTC day", retry_after_s=retry_s),
                     never=never, line=b"{}")


@pytest.mark.parametrize(("retry_s", "never", "expires_in", "expected"), [
    (0.2, False, 3600.0, "sleep"),     # a per-second rate refilling
    (5.0, False, 3600.0, "sleep"),     # at most batch.retry_max_s: still in place
    (5.1, False, 3600.0, "defer"),     # longer: the chunk is parked off the worker
    (3000.0, False, 3600.0, "defer"),  # a daily budget that resets inside the window
    (3601.0, False, 3600.0, "fail"),   # ...or only after it ends
    (0.2, True, 3600.0, "fail"),       # costs more than a whole daily budget: never passes
    (0.2, False, 0.1, "fail"),         # the window ends before even a short wait is over
])
def test_plan(retry_s: float, never: bool, expires_in: float, expected: str) -> None:
    now = 1_700_000_000.0
    assert plan(over(retry_s, never=never), now=now, expires_at=now + expires_in,
                sleep_max_s=5.0) == expected
