"""What the request path reports, through one interface: ``Observer``.

The pipeline, the upstream client and the cache tiers call an ``Observer``; they never hold an
optional metrics object and never check it for ``None``. ``NullObserver`` does nothing (unit
tests, benches); ``MetricsObserver`` turns each event into Prometheus samples with pre-resolved
label children (``labels()`` per call costs a lock and a dict walk, more than a cache lookup).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.errors import PolicyRejected
    from gateway.telemetry.usage import TenantUsage


class DecidedItem(Protocol):
    """One item of a policy decision, as telemetry reads it (gateway.policy.Decision's items)."""

    @property
    def store(self) -> bool: ...
    @property
    def detectors(self) -> Sequence[str]: ...


class DecidedPrivacy(Protocol):
    @property
    def detectors(self) -> Mapping[str, str]: ...


class DecidedRule(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def privacy(self) -> DecidedPrivacy: ...


class DecisionView(Protocol):
    """What telemetry reads of a policy decision: structural, so telemetry never imports the
    policy package (arrows run one way: policy -> telemetry)."""

    @property
    def cache(self) -> bool: ...
    @property
    def rule(self) -> DecidedRule: ...
    @property
    def items(self) -> Sequence[DecidedItem]: ...


class HotView(Protocol):
    """What a hot answer (gateway/pipeline/hot_answers.py) tells the metrics."""

    @property
    def model(self) -> str: ...
    @property
    def entries(self) -> Sequence[object]: ...
    @property
    def decision(self) -> DecisionView: ...
    @property
    def compute_ms(self) -> float: ...
    @property
    def usage(self) -> TenantUsage: ...


class Observer(Protocol):
    """Events of the request path (all cheap, all synchronous, none may raise)."""

    def request_done(self, route: str, status: int, cache: str, seconds: float) -> None:
        """A response is ready: its route pattern, status, X-Cache value and duration."""

    def items_answered(self, model: str, tenant: str, statuses: Sequence[str]) -> None:
        """Items of one request, by final cache status (HIT, MISS, STALE, ...)."""

    def compute_saved(self, model: str, seconds: float) -> None:
        """Backend compute time that cache answers avoided."""

    def coalesced(self, items: int) -> None:
        """Items that joined an identical in-flight backend call."""

    def shed(self, reason: str) -> None:
        """A request refused with 503/504 before or instead of a backend call."""

    def tenant_request(self, tenant: str, outcome: str) -> None:
        """A cached route's request of ``tenant`` ended: ``ok``, ``rate_limited`` (429),
        ``shed`` (503/504) or ``error`` (any other error)."""

    def tenant_usage(self, tenant: str, usage: TenantUsage) -> None:
        """What one answered request of ``tenant`` used: texts, tokens, compute, savings."""

    def hot_answered(self, answer: HotView, tenant: str, from_node: int) -> None:
        """A request of ``tenant`` answered from a hot answer, counted as the full path counts
        an all-HIT answer (lookups, policy decision, items, compute saved, the tenant's usage
        and its ``ok`` request); ``from_node`` of its items came back from the node tier."""

    def rate_limited(self, tenant: str, limit: str) -> None:
        """A request of ``tenant`` refused (429) by one of its limits (requests, texts, daily)."""

    def quota_checked(self, source: str, allowed: bool) -> None:
        """A quota check answered by ``redis`` or (Redis unreachable or absent) ``local``."""

    def policy_decided(self, decision: DecisionView) -> None:
        """A policy decision (and the detectors that fired)."""

    def policy_rejected(self, error: PolicyRejected) -> None:
        """A request a ``reject`` detector refused."""

    def policy_reloaded(self, result: str) -> None:
        """A policy reload ended: ``success`` or ``failure`` (the last good policy stays)."""

    def policy_active(self, old: str | None, new: str, sources: str) -> None:
        """The active policy version changed (``old`` is None at start)."""

    def shadow_differences(self, rule: str, shadow_rule: str, fields: Sequence[str]) -> None:
        """The shadow policy would have decided a request differently, in these fields."""

    def cache_lookups(self, tier: str, result: str, items: int) -> None:
        """Per-item lookups in one tier: result is hit, stale, miss or error."""

    def cache_stored(self, tier: str, items: int) -> None:
        """Entries written to one tier."""

    def cache_bytes(self, tier: str, n: int) -> None:
        """Bytes one tier holds now (the node tier: its pages, after a write)."""

    def cache_sketch_period(self, tier: str, lookups_per_entry: int) -> None:
        """How long one tier's frequency sketch remembers now (it changed, or is first told)."""

    def on_flush(self, collect: Callable[[], None]) -> Callable[[], None]:
        """Have ``collect`` called on the loop before every hand-over of the batched counts
        (every flush interval, and before a scrape renders): a thread's own tallies (the node
        tier's writer) reach the metrics then, without waking the loop once per event.
        Returns what undoes it."""

    def cache_evictions(self, tier: str, items: int, reason: str = "capacity") -> None:
        """Entries one tier dropped or kept out, by ``reason``: ``capacity`` (to stay within
        its bound), ``expired`` (past their deadline), ``rejected`` (new entries the admission
        filter kept out)."""

    def upstream_batch(self, items: int) -> None:
        """Items in one backend call."""

    def upstream_call(self, backend: str, zone: str, outcome: str, seconds: float) -> None:
        """One backend call (an attempt) ended."""

    def upstream_timing(self, backend: str, queue_s: float, compute_s: float) -> None:
        """The queue and compute time a backend reported for a call."""

    def retry(self, reason: str) -> None:
        """A call retried on another backend, and why (connect_failure, reset,
        per_try_timeout, http_<status>)."""

    def retry_overflow(self, reason: str) -> None:
        """A retry the retry budget refused (``reason``: the failure it would have retried)."""

    def hedge(self) -> None:
        """A hedged second copy sent."""

    def ejected(self, backend: str, cause: str) -> None:
        """A backend ejected by outlier detection (consecutive_5xx,
        consecutive_gateway_failure, success_rate)."""

    def backend_health(self, backend: str, zone: str, healthy: bool) -> None:
        """A backend's health (healthy and not ejected) as routing sees it now."""

    def slow_start(self, backend: str, zone: str, active: bool) -> None:
        """Whether a backend is in slow start (back, and its share still ramping up) now."""

    def backend_ready(self, backend: str, zone: str, readies: int) -> None:
        """A backend's health checks passed after failing: its ``readies``-th cold start."""

    def backend_answer(self, backend: str, zone: str, phase: str, seconds: float) -> None:
        """A successful backend call: ``cold`` among its first answers after it became
        ready, else ``steady`` (routing/coldstart.py)."""

    def cache_errors(self, tier: str, items: int) -> None:
        """Errors in one tier (down, slow, corrupt entries)."""

    def circuit_open(self, is_open: bool) -> None:
        """The Redis circuit breaker opened or closed."""

    def admission(self, tier: str, waiting: int, inflight: int, batch_waiting: int = 0) -> None:
        """A tier's queue depth and calls in flight, after a change; ``batch_waiting``: how
        many of the ``waiting`` are batch-class (the rest are interactive)."""

    def queue_wait(self, tier: str, cls: str, outcome: str, seconds: float) -> None:
        """How long a call of class ``cls`` (interactive, batch) waited in ``tier``'s admission
        queue before it was ``granted`` a slot or left it ``shed`` (to make room), ``expired``
        (its deadline passed) or ``cancelled``; calls that did not queue are not reported."""

    def concurrency_limit(self, tier: str, limit: int, min_rtt_s: float | None) -> None:
        """A tier's concurrency limit (and the adaptive minRTT, when adaptive) moved."""

    def batch_lines(self, outcome: str, n: int) -> None:
        """Batch lines answered (``completed``, ``failed``) or tried again later (``retried``:
        the backends shed or failed them)."""

    def batch_deferred(self, reason: str) -> None:
        """A batch line held back so interactive calls keep the capacity (``queued``,
        ``busy``, ``slow``: the tier's calls take longer than their floor, ``no_backend``,
        ``loop_busy``: this process's own CPU is saturated)."""

    def batch_queue(self, lines: int, lag_s: float, batches: Mapping[str, int]) -> None:
        """The batch queue now: lines of unfinished batches still to answer, the age of the
        oldest queue entry, and the unfinished batches by status."""

    def batch_finished(self, status: str) -> None:
        """A batch reached a final status (``completed``, ``cancelled``, ``expired``)."""


def _nothing() -> None:
    pass


class NullObserver:
    """Observes nothing."""

    def request_done(self, route: str, status: int, cache: str, seconds: float) -> None:
        pass

    def items_answered(self, model: str, tenant: str, statuses: Sequence[str]) -> None:
        pass

    def compute_saved(self, model: str, seconds: float) -> None:
        pass

    def coalesced(self, items: int) -> None:
        pass

    def shed(self, reason: str) -> None:
        pass

    def tenant_request(self, tenant: str, outcome: str) -> None:
        pass

    def tenant_usage(self, tenant: str, usage: TenantUsage) -> None:
        pass

    def hot_answered(self, answer: HotView, tenant: str, from_node: int) -> None:
        pass

    def rate_limited(self, tenant: str, limit: str) -> None:
        pass

    def quota_checked(self, source: str, allowed: bool) -> None:
        pass

    def policy_decided(self, decision: DecisionView) -> None:
        pass

    def policy_rejected(self, error: PolicyRejected) -> None:
        pass

    def policy_reloaded(self, result: str) -> None:
        pass

    def policy_active(self, old: str | None, new: str, sources: str) -> None:
        pass

    def shadow_differences(self, rule: str, shadow_rule: str, fields: Sequence[str]) -> None:
        pass

    def cache_lookups(self, tier: str, result: str, items: int) -> None:
        pass

    def cache_stored(self, tier: str, items: int) -> None:
        pass

    def cache_bytes(self, tier: str, n: int) -> None:
        pass

    def cache_sketch_period(self, tier: str, lookups_per_entry: int) -> None:
        pass

    def on_flush(self, collect: Callable[[], None]) -> Callable[[], None]:
        return _nothing

    def cache_evictions(self, tier: str, items: int, reason: str = "capacity") -> None:
        pass

    def upstream_batch(self, items: int) -> None:
        pass

    def upstream_call(self, backend: str, zone: str, outcome: str, seconds: float) -> None:
        pass

    def upstream_timing(self, backend: str, queue_s: float, compute_s: float) -> None:
        pass

    def retry(self, reason: str) -> None:
        pass

    def retry_overflow(self, reason: str) -> None:
        pass

    def hedge(self) -> None:
        pass

    def ejected(self, backend: str, cause: str) -> None:
        pass

    def backend_health(self, backend: str, zone: str, healthy: bool) -> None:
        pass

    def slow_start(self, backend: str, zone: str, active: bool) -> None:
        pass

    def backend_ready(self, backend: str, zone: str, readies: int) -> None:
        pass

    def backend_answer(self, backend: str, zone: str, phase: str, seconds: float) -> None:
        pass

    def cache_errors(self, tier: str, items: int) -> None:
        pass

    def circuit_open(self, is_open: bool) -> None:
        pass

    def admission(self, tier: str, waiting: int, inflight: int, batch_waiting: int = 0) -> None:
        pass

    def queue_wait(self, tier: str, cls: str, outcome: str, seconds: float) -> None:
        pass

    def concurrency_limit(self, tier: str, limit: int, min_rtt_s: float | None) -> None:
        pass

    def batch_lines(self, outcome: str, n: int) -> None:
        pass

    def batch_deferred(self, reason: str) -> None:
        pass

    def batch_queue(self, lines: int, lag_s: float, batches: Mapping[str, int]) -> None:
        pass

    def batch_finished(self, status: str) -> None:
        pass


__all__ = ["DecisionView", "NullObserver", "Observer"]
