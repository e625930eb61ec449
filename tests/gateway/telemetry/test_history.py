"""A history point is the difference of two registry readings (gateway/telemetry/history.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.errors import DeadlineExceeded
from gateway.telemetry.history import Reading, point
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
from gateway.telemetry.samples import Samples, histogram_quantile
from gateway.upstream.admission.adaptive import AdaptiveSettings
from gateway.upstream.admission.control import Admission
from gateway.upstream.admission.settings import AdmissionSettings
from tests.conftest import REPO

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
    m.queue_depth.labels("zone", "interactive").set(4)
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
    # No tier yet, no wait, no backend call: the scheduling fields are left out altogether.
    assert not {"limit", "queue_by_class", "queue_wait_s", "backend_queue_s"} & set(p)


def test_a_counter_that_went_back_counts_nothing() -> None:
    """Counters only grow; if one reads lower (files of a worker removed), it is not negative."""
    before = Reading(mono=1.0, requests={"HIT": 10.0}, shed={"queue_full": 4.0})
    now = Reading(mono=2.0, requests={"HIT": 2.0}, shed={"queue_full": 5.0})
    p = point(before, now, t=2.0)
    assert p["requests"] == {} and p["shed"] == {"queue_full": 1.0}


async def test_a_point_shows_the_queue_per_class_and_the_limit_after_admission_traffic() -> None:
    """Real admission traffic (a fixed limit of 2, an injected clock): the point holds the
    limit, the depth per class at its end, the wait per class of the interval (p50/p99 from
    the buckets' differences) and the queue time the backend reported."""
    now = [0.0]
    m = GatewayMetrics(CollectorRegistry())
    observer = MetricsObserver(m)
    admission = Admission(AdmissionSettings(tier_concurrency=2, tier_queue=10,
                                            adaptive=AdaptiveSettings(enabled=False)),
                          observer=observer, clock=lambda: now[0])
    earlier = await admission.acquire("zone", deadline=60)  # before the first reading
    first = reading(m, mono=10.0)

    other = await admission.acquire("zone", deadline=60)  # at once: not a wait
    waiting = [asyncio.create_task(admission.acquire("zone", deadline=60)) for _ in range(3)]
    bulk = asyncio.create_task(admission.acquire("zone", deadline=60, priority="batch"))
    hurried = asyncio.create_task(admission.acquire("zone", deadline=0.05, priority="batch"))
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded):  # left the queue after 0 s of the injected clock
        await hurried
    now[0] = 0.03  # the three waited 30 ms: in (0.025, 0.05]
    earlier.release()
    other.release()
    held = [await waiting[0], await waiting[1]]
    observer.upstream_timing("b1", 0.004, 0.010)
    p = point(first, reading(m, mono=11.0), t=11.0)

    assert p["limit"] == {"zone": 2} and p["inflight"] == {"zone": 2}
    assert p["queue_depth"] == {"zone": 2}
    assert p["queue_by_class"] == {"zone": {"interactive": 1, "batch": 1}}
    assert set(p["queue_wait_s"]) == {"interactive", "batch"}
    interactive = p["queue_wait_s"]["interactive"]
    assert interactive["count"] == 2  # the two that queued 30 ms (not ``other``, ``earlier``)
    assert interactive["p50"] == pytest.approx(0.025 + 0.025 * 1 / 2)
    assert 0.025 < interactive["p99"] <= 0.05 and set(interactive) == {"count", "p50", "p99"}
    assert p["queue_wait_s"]["batch"]["count"] == 1  # the one that expired, at 0 s
    assert p["queue_wait_s"]["batch"]["p99"] <= 0.0001
    [(backend, queued)] = p["backend_queue_s"].items()
    assert backend == "b1" and queued["count"] == 1 and 0.0025 < queued["p99"] <= 0.005

    for slot in held:
        slot.release()
    (await waiting[2]).release()
    (await bulk).release()
    quiet = point(reading(m, mono=12.0), reading(m, mono=13.0), t=13.0)
    assert quiet["limit"] == {"zone": 2} and quiet["queue_depth"] == {"zone": 0}
    assert "queue_by_class" not in quiet and "queue_wait_s" not in quiet


_WORKER = """
import sys
from prometheus_client import CollectorRegistry
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import MetricsObserver
observer = MetricsObserver(GatewayMetrics(CollectorRegistry()))
n = int(sys.argv[1])
observer.admission("zone", n, 1, batch_waiting=1)
observer.concurrency_limit("zone", 8, 0.005)
for _ in range(n):
    observer.queue_wait("zone", "batch", "granted", 0.2)
observer.queue_wait("zone", "interactive", "granted", 0.0)
observer.flush()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="multiprocess metrics files need Linux")
async def test_scheduling_fields_add_up_across_worker_processes(tmp_path: Path) -> None:
    """Two workers' gauges and histograms, read back from their files: the host's sums."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", _WORKER, str(n),
                                                  cwd=REPO, env=env) for n in (3, 4)]
    assert [await asyncio.wait_for(p.wait(), 60) for p in procs] == [0, 0]
    files = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(files, path=str(tmp_path))  # type: ignore[no-untyped-call]
    p = point(Reading(mono=0.0), Reading.of(Samples(files), 1.0), t=1.0)
    assert p["queue_depth"] == {"zone": 7} and p["inflight"] == {"zone": 2}
    assert p["queue_by_class"] == {"zone": {"interactive": 5, "batch": 2}}
    assert p["limit"] == {"zone": 16}
    assert p["queue_wait_s"]["batch"]["count"] == 7
    assert 0.1 < p["queue_wait_s"]["batch"]["p50"] <= 0.25
    assert p["queue_wait_s"]["interactive"]["count"] == 2
