"""The noisy-neighbour benchmark's pieces that decide its figures: who sends which request in the
mixed stream, what counts for a tenant, and the report's targets (no servers, no timing)."""

from __future__ import annotations

import math
from pathlib import Path

from bench import tenants
from bench.loadgen import LoadResult, Sample
from gateway.tenants.directory import Tenants


def test_the_mixed_stream_spaces_the_quiet_tenant_evenly() -> None:
    tenant_of = tenants.mixed_schedule(5.0, 0.3)
    who = [tenant_of(i) for i in range(5300)]
    assert who.count("b") == 300
    gaps = [j - i for i, j in zip([i for i, t in enumerate(who) if t == "b"],
                                  [i for i, t in enumerate(who) if t == "b"][1:], strict=False)]
    assert set(gaps) <= {17, 18}  # 5.3 / 0.3 = 17.7 requests apart


def test_the_tenants_file_gives_each_tenant_its_key(tmp_path: Path) -> None:
    loaded = Tenants.load(tenants.tenants_file(tmp_path))
    assert loaded.identify(f"Bearer {tenants.KEYS['a']}") == "a"
    assert loaded.identify(f"Bearer {tenants.KEYS['b']}") == "b"
    assert loaded.spec("a").quota.limited is False  # fair share, not a rate limit


def sample(i: int, status: int, ms: float) -> Sample:
    return Sample(index=i, sent_s=i / 100, latency_s=ms / 1000, lag_s=0.0, status=status)


def test_the_report_reads_each_tenant_from_the_same_stream() -> None:
    plan = tenants.parse(["--quick"])
    alone = tenants.Phase("B alone", 1, 30.0, LoadResult(
        "open", [sample(i, 200, 20.0) for i in range(100)], 1.0, 100), lambda i: "b", 0.0)
    mixed_of = tenants.mixed_schedule(1.0, 1.0)  # every other request is B's
    both = tenants.Phase("A + B", 1, 60.0, LoadResult(
        "open", [sample(i, 200 if mixed_of(i) == "b" or i % 4 == 0 else 503, 30.0)
                 for i in range(200)], 1.0, 200), mixed_of, 0.0)
    assert both.goodput("b") == 1.0 and both.goodput("a") == 0.5
    assert both.rate_2xx("a") == 50.0 and math.isclose(both.p("b", 99), 30.0)
    text = tenants.report(plan, [100.0], [alone, both], "now")
    assert "| B's goodput under A's flood (2xx / sent) | 1.000 | >= 0.95 | yes |" in text
    assert "| B's p99 under the flood / B's p99 alone | 1.500 | <= 2 | yes |" in text
    assert "| A gets the rest: (A + B 2xx/s) / C | 1.500 | >= 0.95 | yes |" in text
