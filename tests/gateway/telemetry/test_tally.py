"""Batched metrics: what a Tally hands to prometheus-client equals what direct updates give."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.telemetry.batched_counts import Tally
from gateway.telemetry.metrics import LATENCY_BUCKETS, GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver


def test_counters_and_histograms_match_direct_updates() -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    dc = Counter("c", "c", ["a"], registry=direct)
    dh = Histogram("h", "h", ["a"], buckets=LATENCY_BUCKETS, registry=direct)
    bc = Counter("c", "c", ["a"], registry=batched)
    bh = Histogram("h", "h", ["a"], buckets=LATENCY_BUCKETS, registry=batched)
    tally = Tally()
    rng = random.Random(5)
    for _ in range(500):
        label = rng.choice("xyz")
        value = rng.choice([0.0, 0.0001, 0.00099, 0.001, 0.3, 2.5, 99.0, rng.random()])
        dc.labels(label).inc(value)
        dh.labels(label).observe(value)
        tally.inc(bc, (label,), value)
        tally.observe(bh, (label,), value)
    assert not batched.get_sample_value("c_total", {"a": "x"})  # nothing handed over yet
    tally.flush()
    for family in direct.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # when each series was made, not what it counts
            got = batched.get_sample_value(sample.name, sample.labels)
            assert got is not None and abs(got - sample.value) < 1e-9, sample
    tally.flush()  # nothing pending: nothing changes
    assert batched.get_sample_value("c_total", {"a": "x"}) == direct.get_sample_value(
        "c_total", {"a": "x"})


def test_gauges_take_their_latest_value_at_the_flush() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("g", "g", ["tier"], registry=registry)
    tally = Tally()
    for value in (3, 7, 2):
        tally.set(gauge, ("zone",), value)
    assert registry.get_sample_value("g", {"tier": "zone"}) == 0  # nothing handed over yet
    tally.flush()
    assert registry.get_sample_value("g", {"tier": "zone"}) == 2
    gauge.labels("zone").set(9)  # set elsewhere since: an idle flush leaves it alone
    tally.flush()
    assert registry.get_sample_value("g", {"tier": "zone"}) == 9
    tally.set(gauge, ("zone",), 0)
    tally.flush()
    assert registry.get_sample_value("g", {"tier": "zone"}) == 0


def test_admission_gauges_are_exact_at_every_collection() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    observer = MetricsObserver(metrics)
    observer.admission("zone", 4, 2)
    observer.admission("zone", 3, 1, batch_waiting=1)
    registry = metrics.registry  # collecting flushes the tally first
    depth = {c: registry.get_sample_value("gateway_queue_depth", {"tier": "zone", "class": c})
             for c in ("interactive", "batch")}
    assert depth == {"interactive": 2, "batch": 1}  # ``sum by (tier)``: 3, as before
    observer.admission("zone", 0, 1)  # the batch waiter left: its series back to 0
    assert registry.get_sample_value("gateway_queue_depth",
                                     {"tier": "zone", "class": "batch"}) == 0
    assert registry.get_sample_value("gateway_queue_depth",
                                     {"tier": "zone", "class": "interactive"}) == 0
    assert registry.get_sample_value("gateway_upstream_inflight", {"tier": "zone"}) == 1


def test_reading_the_registry_flushes_first() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(GatewayMetrics(registry))
    observer.request_done("/v1/embeddings", 200, "HIT", 0.002)
    observer.shed("queue_full")
    assert registry.get_sample_value("gateway_shed_total", {"reason": "queue_full"}) == 1
    assert registry.get_sample_value("gateway_requests_total", {
        "route": "/v1/embeddings", "status": "200", "cache": "HIT"}) == 1
    assert registry.get_sample_value("gateway_request_duration_seconds_bucket", {
        "route": "/v1/embeddings", "cache": "HIT", "le": "0.0025"}) == 1


def test_a_record_is_expanded_once_per_key_at_the_flush_with_its_count() -> None:
    registry = CollectorRegistry()
    counter = Counter("r", "r", ["a"], registry=registry)
    tally = Tally()
    calls: list[tuple[str, int]] = []

    def expand(args: tuple[str, float], times: int) -> None:
        calls.append((args[0], times))
        tally.inc(counter, (args[0],), args[1] * times)

    x, y = ("x", 2.0), ("y", 0.5)
    for args in (x, x, y, x):
        tally.record(args, expand, args)
    assert calls == [] and not registry.get_sample_value("r_total", {"a": "x"})
    tally.flush()  # expanded first, then handed over in the same flush
    assert sorted(calls) == [("x", 3), ("y", 1)]
    assert registry.get_sample_value("r_total", {"a": "x"}) == 6.0
    assert registry.get_sample_value("r_total", {"a": "y"}) == 0.5
    tally.flush()  # records are forgotten once expanded: nothing counted twice
    assert len(calls) == 2 and registry.get_sample_value("r_total", {"a": "x"}) == 6.0
    tally.record(x, expand, x)
    tally.flush()
    assert calls[-1] == ("x", 1) and registry.get_sample_value("r_total", {"a": "x"}) == 8.0
