"""The circuit breaker's state machine, on an injected clock."""

from __future__ import annotations

from gateway.cache.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state(b: CircuitBreaker) -> BreakerState:
    # A call, so that mypy does not narrow the state across the breaker's own transitions.
    return b.state


def make(threshold: int = 3) -> tuple[CircuitBreaker, Clock, list[bool]]:
    clock, changes = Clock(), list[bool]()
    b = CircuitBreaker(failure_threshold=threshold, open_s=2.0, clock=clock,
                       on_change=changes.append)
    return b, clock, changes


def test_opens_after_consecutive_failures_only() -> None:
    b, _, changes = make()
    b.failure()
    b.failure()
    b.success()  # resets the count
    b.failure()
    b.failure()
    assert state(b) is BreakerState.CLOSED and b.allow()
    b.failure()
    assert state(b) is BreakerState.OPEN and not b.allow()
    assert changes == [True]


def test_half_open_lets_one_probe_and_closes_on_success() -> None:
    b, clock, changes = make(threshold=1)
    b.failure()
    clock.now = 1.9
    assert not b.allow()
    clock.now = 2.0
    assert b.allow()  # the probe
    assert state(b) is BreakerState.HALF_OPEN
    assert not b.allow()  # only one at a time
    b.success()
    assert state(b) is BreakerState.CLOSED and b.allow()
    assert changes == [True, False]


def test_failed_probe_reopens_for_another_period() -> None:
    b, clock, changes = make(threshold=1)
    b.failure()
    clock.now = 2.5
    assert b.allow()
    b.failure()
    assert state(b) is BreakerState.OPEN
    clock.now = 4.0
    assert not b.allow()
    clock.now = 4.5
    assert b.allow()
    assert changes == [True]  # still the same outage


def test_abandoned_probe_lets_the_next_caller_probe() -> None:
    b, clock, _ = make(threshold=1)
    b.failure()
    clock.now = 3
    assert b.allow()
    b.release()
    assert b.allow()
