"""The quota arithmetic at its edges, exactly: what a RateLimit header and a 429 would state.

Written to kill the mutants ``make mutate`` found surviving in gateway/tenants/quota/gcra.py.
"""

from __future__ import annotations

import pytest

from gateway.tenants.quota.gcra import DAY_S, Limit, Verdict, daily, rate

NOON = 100 * DAY_S + DAY_S / 2
DAY = Limit("daily", "day", 10.0)
TEXTS = Limit("texts", "rate", 2.0, burst=4)


def test_a_charge_landing_exactly_on_the_budget_passes_and_the_next_is_refused() -> None:
    verdict, used = daily(DAY, 7.0, NOON, 3.0)
    assert verdict == Verdict(True, 0, DAY_S / 2, 0.0) and used == 10.0
    refused, same = daily(DAY, 7.5, NOON, 3.0)
    assert refused == Verdict(False, 2, DAY_S / 2, DAY_S / 2) and same == 7.5


def test_reading_an_exhausted_budget_is_not_refused() -> None:
    verdict, used = daily(DAY, 10.0, NOON, 0.0)
    assert verdict == Verdict(True, 0, DAY_S / 2, 0.0) and used == 10.0
    over, _ = daily(DAY, 12.0, NOON, 1.0)
    assert over.remaining == 0 and not over.allowed
    # A budget lowered below what was already used today: reading it still passes.
    lowered, still = daily(DAY, 12.0, NOON, 0.0)
    assert lowered.allowed and lowered.remaining == 0 and still == 12.0


def test_a_charge_within_the_rounding_tolerance_of_the_budget_passes() -> None:
    verdict, used = daily(DAY, 10.0, NOON, 1e-9)
    assert verdict.allowed and used == 10.0 + 1e-9


def test_an_allowed_rate_charge_has_no_retry_and_exact_remaining() -> None:
    verdict, tat = rate(TEXTS, 0.0, 50.0, 1.0)
    assert verdict == Verdict(True, 3, 0.5, 0.0) and tat == 50.5


def test_a_charge_larger_than_the_burst_passes_when_the_limit_is_whole() -> None:
    whole = Limit("texts", "rate", 1.0, burst=1)
    verdict, tat = rate(whole, 0.0, 50.0, 1.5)
    assert verdict.allowed and verdict.retry_s == 0.0 and tat == pytest.approx(51.5)
    small = Limit("texts", "rate", 1.0, burst=0)
    tiny, _ = rate(small, 0.0, 50.0, 0.5)
    assert tiny.allowed, "any positive charge passes on a whole limit"


def test_a_refused_rate_charge_reports_what_is_left() -> None:
    refused, tat = rate(TEXTS, 52.0, 50.0, 1.0)  # 4 in flight of a burst of 4
    assert refused == Verdict(False, 0, 2.0, 0.5) and tat == 52.0
    partly, _ = rate(TEXTS, 51.0, 50.0, 3.0)  # 2 used: 2 left, 3 asked
    assert partly == Verdict(False, 2, 1.0, 0.5)
