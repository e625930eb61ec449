"""A history point is the difference of two registry readings (gateway/telemetry/history.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.telemetry.history import Reading, point
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.samples import Samples, histogram_quantile

EMBED = "/v1/embeddings"


def reading(m: GatewayMetrics, mono: float) -> Reading:
    return Reading.of(Samples(m.registry), mono)


def test_a_point_holds_what_happened_between_two_readings() -> None:
    m = GatewayMetrics(CollectorRegistry())
    # Before the first reading: traffic the point must not count.
    m.requests.labels(EMBED, "200", "HIT").inc(5)
    for _ in range(5):
        m.request_duration.labels(EMBED, "HIT").observe(0.0002)
    m.cache_items.labels("minilm", "public", "hit").inc(5)
    m.cache_lookups.labels("l1", "hit").inc(5)
    m.shed.labels("queue_full").inc(7)
    m.upstream_duration.labels("b1", "z", "ok").observe(3.0)
    first = reading(m, mono=100.0)

    m.requests.labels(EMBED, "200", "HIT").inc(3)
    m.requests.labels(EMBED, "200", "MISS").inc(1)
    m.requests.labels("/dashboard/stats.json", "200", "BYPASS").inc(9)  # not inference
    for _ in range(3):
        m.request_duration.labels(EMBED, "HIT").observe(0.003)
    m.request_duration.labels(EMBED, "MISS").observe(0.02)
    m.request_duration.labels("/dashboard/stats.json", "BYPASS").observe(0.5)
    m.cache_items.labels("minilm", "public", "hit").inc(3)
    m.cache_items.labels("minilm", "public", "miss").inc(1)
    m.cache_lookups.labels("l1", "hit").inc(3)
    m.cache_lookups.labels("l1", "miss").inc(1)
    m.cache_lookups.labels("node", "miss").inc(1)
    m.shed.labels("deadline").inc(2)
    for _ in range(4):
        m.upstream_duration.labels("b1", "z", "ok").observe(0.25)
    m.queue_depth.labels("zone").set(4)
    m.inflight.labels("zone").set(2)
    p = point(first, reading(m, mono=102.0), t=1_700_000_000.5)

    assert p["t"] == 1_700_000_000.5 and p["dt"] == 2.0
    assert p["requests"] == {"HIT": 3, "MISS": 1}
    assert p["items"] == {"hit": 3, "miss": 1}
    assert p["hit_ratio"] == pytest.approx(0.75)
    assert p["tier_hit_ratio"] == {"l1": pytest.approx(0.75), "node": 0.0}
    assert p["shed"] == {"deadline": 2}  # queue_full did not move: left out
    assert p["queue_depth"] == {"zone": 4} and p["inflight"] == {"zone": 2}
    assert p["backend_busy"] == {"b1": pytest.approx(4 * 0.25 / 2.0)}  # busy s per s
    assert set(p["latency_s"]) == {"HIT", "MISS"}
    hit = p["latency_s"]["HIT"]
    # From the interval's buckets alone: all three in (0.0025, 0.005], none of the earlier 0.2 ms.
    assert hit["count"] == 3
    assert 0.0025 < hit["p50"] <= hit["p95"] <= hit["p99"] <= 0.005
    assert hit["p50"] == pytest.approx(histogram_quantile(0.5, [(0.0025, 0), (0.005, 3),
                                                               (float("inf"), 3)]))
    assert p["latency_s"]["MISS"]["count"] == 1


def test_a_quiet_interval_is_an_empty_point() -> None:
    m = GatewayMetrics(CollectorRegistry())
    m.requests.labels(EMBED, "200", "HIT").inc(5)
    m.request_duration.labels(EMBED, "HIT").observe(0.001)
    before = reading(m, mono=1.0)
    p = point(before, reading(m, mono=2.0), t=2.0)
    assert p["requests"] == {} and p["items"] == {} and p["shed"] == {}
    assert p["hit_ratio"] is None and p["latency_s"] == {}


def test_a_counter_that_went_back_counts_nothing() -> None:
    """Counters only grow; if one reads lower (files of a worker removed), it is not negative."""
    before = Reading(mono=1.0, requests={"HIT": 10.0}, shed={"queue_full": 4.0})
    now = Reading(mono=2.0, requests={"HIT": 2.0}, shed={"queue_full": 5.0})
    p = point(before, now, t=2.0)
    assert p["requests"] == {} and p["shed"] == {"queue_full": 1.0}
