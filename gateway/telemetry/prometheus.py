"""``MetricsObserver``: the ``Observer`` (gateway/telemetry/observer.py) over ``GatewayMetrics``
(Prometheus). Counters and histograms on the request path go through the batched ``Tally``;
gauges are set at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.telemetry.tenant_labels import TenantLabels

if TYPE_CHECKING:
    from gateway.errors import PolicyRejected
    from gateway.telemetry.batched_counts import Series
    from gateway.telemetry.metrics import GatewayMetrics
    from gateway.telemetry.observer import DecisionView, HotView
    from gateway.telemetry.usage import TenantUsage


class MetricsObserver:
    """Observer over ``GatewayMetrics`` (Prometheus). Counters and histograms on the request path
    go through a ``Tally`` (batched; ``flush`` hands them over), and so do the admission gauges
    that move with every backend call (their latest value); other gauges are set at once."""

    def __init__(self, metrics: GatewayMetrics, *, top_tenants: int = 20) -> None:
        self.metrics = metrics
        self.tally = metrics.tally
        self.tenants = TenantLabels(top_tenants)
        """Per-tenant series are labelled by the busiest ``top_tenants`` ids, the rest ``other``."""
        self._batch_waiting: set[str] = set()  # tiers whose batch-class queue depth is not 0
        self._done: dict[tuple[str, int, str], tuple[list[Any], Series]] = {}

    def flush(self) -> None:
        self.tally.flush()

    def request_done(self, route: str, status: int, cache: str, seconds: float) -> None:
        # Every request: its counter slot and histogram series are kept per (route, status,
        # cache), so a request costs one dict read and two additions (no label tuples).
        found = self._done.get((route, status, cache))
        if found is None:
            m, t = self.metrics, self.tally
            found = self._done[(route, status, cache)] = (
                t.counter(m.requests, (route, str(status), cache)),
                t.series(m.request_duration, (route, cache)))
        found[0][1] += 1
        found[1].add(seconds)

    def items_answered(self, model: str, tenant: str, statuses: Sequence[str]) -> None:
        m, t = self.metrics, self.tally
        for status in statuses:
            t.inc(m.cache_items, (model, tenant, status.lower()))

    def compute_saved(self, model: str, seconds: float) -> None:
        self.tally.inc(self.metrics.compute_saved, (model,), seconds)

    def coalesced(self, items: int) -> None:
        self.tally.inc(self.metrics.coalesced, (), items)

    def shed(self, reason: str) -> None:
        self.tally.inc(self.metrics.shed, (reason,))

    def tenant_request(self, tenant: str, outcome: str) -> None:
        self.tally.inc(self.metrics.tenant_requests, (self.tenants.label(tenant), outcome))

    def tenant_usage(self, tenant: str, usage: TenantUsage, times: int = 1) -> None:
        """``usage`` of one request, or of ``times`` requests that each used the same."""
        m, t, label = self.metrics, self.tally, self.tenants.of(tenant)
        for source, n in (("backend", usage.backend_texts), ("cache", usage.cached_texts),
                          ("coalesced", usage.coalesced_texts)):
            if n:
                t.inc(m.tenant_texts, (label, source), n * times)
        if usage.tokens:
            t.inc(m.tenant_tokens, (label,), usage.tokens * times)
        if usage.compute_s:
            t.inc(m.tenant_compute, (label,), usage.compute_s * times)
        if usage.saved_s:
            t.inc(m.tenant_saved, (label,), usage.saved_s * times)

    def hot_answered(self, answer: HotView, tenant: str, from_node: int) -> None:
        """One ``Tally.record`` per hot answer (the hit path's cheapest request): its nine or
        so updates are made at the flush, by ``_hot``, once per distinct answer, tenant and
        ``from_node``, each multiplied by how many requests it answered."""
        key = (answer, tenant, from_node)  # a hot answer hashes by identity
        self.tally.record(key, self._hot, key)

    def _hot(self, args: tuple[HotView, str, int], times: int) -> None:
        answer, tenant, from_node = args
        m, t = self.metrics, self.tally
        n = len(answer.entries)
        self.cache_lookups("l1", "hit", (n - from_node) * times)
        if from_node:
            self.cache_lookups("l1", "miss", from_node * times)
            self.cache_lookups("node", "hit", from_node * times)
        self.policy_decided(answer.decision, times)
        t.inc(m.cache_items, (answer.model, tenant, "hit"), n * times)
        if answer.compute_ms:
            self.compute_saved(answer.model, answer.compute_ms / 1000.0 * times)
        self.tenant_usage(tenant, answer.usage, times)
        t.inc(m.tenant_requests, (self.tenants.label(tenant, times), "ok"), times)

    def rate_limited(self, tenant: str, limit: str) -> None:
        self.tally.inc(self.metrics.tenant_rate_limited, (self.tenants.of(tenant), limit))

    def quota_checked(self, source: str, allowed: bool) -> None:
        self.tally.inc(self.metrics.quota_checks, (source, "allowed" if allowed else "limited"))

    def policy_decided(self, decision: DecisionView, times: int = 1) -> None:
        m, t = self.metrics, self.tally
        kind = "cache" if decision.cache else "no_cache"
        if decision.cache and not all(item.store for item in decision.items):
            kind = "no_store_items"
        t.inc(m.policy_decisions, (decision.rule.name, kind), times)
        actions = decision.rule.privacy.detectors
        for item in decision.items:
            for name in item.detectors:
                t.inc(m.pii_detections, (name, actions[name]), times)

    def policy_rejected(self, error: PolicyRejected) -> None:
        m, t = self.metrics, self.tally
        t.inc(m.policy_decisions, (error.rule, "reject"))
        t.inc(m.pii_detections, (error.detector, "reject"))

    def policy_reloaded(self, result: str) -> None:
        self.tally.inc(self.metrics.policy_reloads, (result,))

    def policy_active(self, old: str | None, new: str, sources: str) -> None:
        m = self.metrics
        if old is not None and old != new:
            m.policy_version.labels(old).set(0)
        m.policy_version.labels(new).set(1)
        if m.policy_info is not None:
            m.policy_info.info({"version": new, "sources": sources})

    def shadow_differences(self, rule: str, shadow_rule: str, fields: Sequence[str]) -> None:
        for name in fields:
            self.tally.inc(self.metrics.policy_shadow_diffs, (rule, shadow_rule, name))

    def cache_lookups(self, tier: str, result: str, items: int) -> None:
        if items:
            self.tally.inc(self.metrics.cache_lookups, (tier, result), items)

    def cache_stored(self, tier: str, items: int) -> None:
        if items:
            self.tally.inc(self.metrics.cache_stores, (tier,), items)

    def cache_bytes(self, tier: str, n: int) -> None:
        self.metrics.child(self.metrics.cache_bytes, tier).set(n)

    def cache_sketch_period(self, tier: str, lookups_per_entry: int) -> None:
        self.metrics.child(self.metrics.cache_sketch_period, tier).set(lookups_per_entry)

    def on_flush(self, collect: Callable[[], None]) -> Callable[[], None]:
        return self.tally.before_flush(collect)

    def cache_evictions(self, tier: str, items: int, reason: str = "capacity") -> None:
        if items:
            self.tally.inc(self.metrics.cache_evictions, (tier, reason), items)

    def upstream_batch(self, items: int) -> None:
        self.tally.observe(self.metrics.upstream_batch, (), items)

    def upstream_call(self, backend: str, zone: str, outcome: str, seconds: float) -> None:
        m, t = self.metrics, self.tally
        t.observe(m.upstream_duration, (backend, zone, outcome), seconds)
        t.inc(m.backend_requests, (backend, zone, outcome))

    def upstream_timing(self, backend: str, queue_s: float, compute_s: float) -> None:
        m, t = self.metrics, self.tally
        t.observe(m.upstream_queue, (backend,), queue_s)
        t.observe(m.upstream_compute, (backend,), compute_s)

    def retry(self, reason: str) -> None:
        self.tally.inc(self.metrics.retries, (reason,))

    def retry_overflow(self, reason: str) -> None:
        self.tally.inc(self.metrics.retry_overflow, (reason,))

    def hedge(self) -> None:
        self.tally.inc(self.metrics.hedges, ())

    def ejected(self, backend: str, cause: str) -> None:
        self.tally.inc(self.metrics.ejections, (backend, cause))

    def backend_health(self, backend: str, zone: str, healthy: bool) -> None:
        self.metrics.child(self.metrics.backend_healthy, backend, zone).set(1 if healthy else 0)

    def slow_start(self, backend: str, zone: str, active: bool) -> None:
        self.metrics.child(self.metrics.slow_start, backend, zone).set(1 if active else 0)

    def backend_ready(self, backend: str, zone: str, readies: int) -> None:
        self.metrics.child(self.metrics.backend_readies, backend, zone).set(readies)

    def backend_answer(self, backend: str, zone: str, phase: str, seconds: float) -> None:
        self.tally.observe(self.metrics.backend_answer, (backend, zone, phase), seconds)

    def cache_errors(self, tier: str, items: int) -> None:
        if items:
            self.tally.inc(self.metrics.cache_errors, (tier,), items)

    def circuit_open(self, is_open: bool) -> None:
        self.metrics.redis_circuit_open.set(1 if is_open else 0)

    def admission(self, tier: str, waiting: int, inflight: int, batch_waiting: int = 0) -> None:
        # Twice per backend call (grant, release): batched like the counters; setting them at
        # once took a lock each (and a memory-mapped write with several workers) on every miss.
        m, t = self.metrics, self.tally
        t.set(m.queue_depth, (tier, "interactive"), waiting - batch_waiting)
        if batch_waiting or tier in self._batch_waiting:  # the batch series once one waited
            t.set(m.queue_depth, (tier, "batch"), batch_waiting)
            if batch_waiting:
                self._batch_waiting.add(tier)
            else:
                self._batch_waiting.discard(tier)
        t.set(m.inflight, (tier,), inflight)

    def queue_wait(self, tier: str, cls: str, outcome: str, seconds: float) -> None:
        self.tally.observe(self.metrics.queue_wait, (tier, cls, outcome), seconds)

    def concurrency_limit(self, tier: str, limit: int, min_rtt_s: float | None) -> None:
        m = self.metrics
        m.child(m.concurrency_limit, tier).set(limit)
        if min_rtt_s is not None:
            m.child(m.min_rtt, tier).set(min_rtt_s)

    def batch_lines(self, outcome: str, n: int) -> None:
        self.tally.inc(self.metrics.batch_lines, (outcome,), n)

    def batch_deferred(self, reason: str) -> None:
        self.tally.inc(self.metrics.batch_deferred, (reason,))

    def batch_queue(self, lines: int, lag_s: float, batches: Mapping[str, int]) -> None:
        m = self.metrics
        m.batch_queue_lines.set(lines)
        m.batch_queue_lag.set(lag_s)
        for status, n in batches.items():
            m.child(m.batch_jobs, status).set(n)

    def batch_finished(self, status: str) -> None:
        self.tally.inc(self.metrics.batch_finished, (status,))
