"""The retry policy and the retry budget, named as Envoy names them (pure: no I/O, no clock).

``RetryPolicy`` says whether a failed try is retried, from the failure's reason (how
``wire.py`` names it) and the ``retry_on`` conditions:

    connect_failure    refused, unreachable, connect timeout   connect-failure, gateway-error, 5xx
    reset              dropped before a complete answer        reset, gateway-error, 5xx
    per_try_timeout    no answer within the per-try timeout    reset, gateway-error, 5xx
    http_<5xx>         a 5xx answer                            5xx; gateway-error (502, 503,
                                                               504); retriable-status-codes

A 4xx is never retried, and neither is a malformed answer. ``RetryBudget`` keeps the retries in
flight at most ``retry_budget_percent`` of the requests in flight (never below
``retry_budget_min_concurrency``), so during an overload or a wide outage retries cannot
multiply the load; the upstream client counts what it refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.config import RoutingSettings

_GATEWAY_ERRORS = frozenset({502, 503, 504})
_CONDITIONS: dict[str, frozenset[str]] = {
    "connect_failure": frozenset({"connect-failure", "gateway-error", "5xx"}),
    "reset": frozenset({"reset", "gateway-error", "5xx"}),
    "per_try_timeout": frozenset({"reset", "gateway-error", "5xx"}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Which failures are retried, and how many times per request."""

    num_retries: int
    retry_on: frozenset[str]
    status_codes: frozenset[int]

    @classmethod
    def from_settings(cls, settings: RoutingSettings) -> RetryPolicy:
        """The policy the ``routing`` section describes (none when ``retry`` is false)."""
        return cls(num_retries=settings.num_retries if settings.retry else 0,
                   retry_on=frozenset(settings.retry_on),
                   status_codes=frozenset(settings.retriable_status_codes))

    def retries(self, reason: str) -> bool:
        """Whether a try that failed for ``reason`` may be retried (on another backend)."""
        if reason.startswith("http_"):
            status = int(reason.removeprefix("http_"))
            if not 500 <= status < 600:
                return False
            return ("5xx" in self.retry_on
                    or ("gateway-error" in self.retry_on and status in _GATEWAY_ERRORS)
                    or ("retriable-status-codes" in self.retry_on
                        and status in self.status_codes))
        return bool(_CONDITIONS.get(reason, frozenset()) & self.retry_on)


class RetryBudget:
    """Envoy's ``retry_budget``: retries in flight at most ``percent`` of the active requests
    (a request counts as active from its first try to its answer, retries included), and never
    fewer than ``min_concurrency`` allowed."""

    def __init__(self, *, percent: float, min_concurrency: int) -> None:
        self._percent = percent
        self._min = min_concurrency
        self.active = 0
        """Requests in flight."""
        self.retries = 0
        """Retries in flight."""

    def limit(self) -> int:
        """Retries allowed in flight now."""
        return max(self._min, int(self.active * self._percent / 100.0))

    def try_acquire(self) -> bool:
        """Take a place for one retry; False when the budget is spent (nothing taken)."""
        if self.retries >= self.limit():
            return False
        self.retries += 1
        return True

    def release(self) -> None:
        """A retry ended."""
        self.retries = max(0, self.retries - 1)
