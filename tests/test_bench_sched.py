"""The scheduling benchmark's pieces that decide its figures: the plan, the tenants file (bulk is
batch class) and the report's targets (no servers, no timing)."""

from __future__ import annotations

from pathlib import Path

from bench import sched
from bench.loadgen import LoadResult, Sample
from bench.procs import split_cores
from bench.sched_report import report
from bench.tenants import Phase
from gateway.tenants.directory import Tenants
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE


def sample(i: int, status: int, ms: float) -> Sample:
    return Sample(index=i, sent_s=i / 100, latency_s=ms / 1000, lag_s=0.0, status=status)


def phase(name: str, tenant_of: object, statuses: list[tuple[int, float]]) -> Phase:
    result = LoadResult("open", [sample(i, s, ms) for i, (s, ms) in enumerate(statuses)],
                        1.0, len(statuses))
    return Phase(name, 1, 1.0, result, tenant_of, 0.0)  # type: ignore[arg-type]


def test_the_plan_and_the_quick_mode() -> None:
    assert sched.parse([]).rounds == 2 and sched.parse([]).burst == 300
    quick = sched.parse(["--quick"])
    assert quick.rounds == 1 and quick.duration_s == 2.0


def test_the_tenants_file_makes_bulk_a_batch_tenant(tmp_path: Path) -> None:
    loaded = Tenants.load(sched.tenants_file(tmp_path))
    assert loaded.identify(f"Bearer {sched.KEYS['bulk']}") == "bulk"
    assert loaded.spec("bulk").priority == BATCH
    assert loaded.spec("b").priority == INTERACTIVE


def test_the_report_computes_the_targets_from_the_phases() -> None:
    ok = [(200, 10.0)] * 100
    phases = [
        phase("B alone 0.3", lambda i: "b", ok),
        phase("A + B", lambda i: "b" if i % 10 == 0 else "a", [(200, 15.0)] * 100),
        phase("B alone 0.6", lambda i: "b", ok),
        phase("B + bulk", lambda i: "b" if i % 2 else "bulk", [(200, 30.0)] * 100),
        phase("A 0.7", lambda i: "a", ok),
        phase("A 3x", lambda i: "a", [(200, 40.0)] * 50 + [(503, 1.0)] * 50),
    ]
    burst = sched.Burst(c_long=50.0, result=LoadResult(
        "closed", [sample(i, 200 if i < 20 else 503, 300.0 if i < 20 else 20.0)
                   for i in range(100)], 1.0, 100), computed=21.0, other_cpu=0.0)
    text = report(split_cores(), 1, 2.0, [100.0], phases, [burst], "now")
    assert "| Noisy: B p99 / B alone | 1.500 | <= 2 | yes |" in text
    assert "| Noisy: (A + B) 2xx/s / C | 1.000 | >= 0.85 | yes |" in text
    assert "| Batch beside: B p99 / B alone | 3.000 | <= 1.5 | NO |" in text
    assert "| Batch beside: bulk 2xx/s / (C - 0.6 C) | 1.250 | >= 0.6 | yes |" in text
    assert "| Overload 3x C: 2xx/s / C | 0.500 | >= 0.9 | NO |" in text
    assert "| Deadlines: served / (0.9 x C_long x 0.6 s) | 0.741 | >= 1 | NO |" in text
    assert "| Deadlines: computed / served | 1.050 | <= 1.1 | yes |" in text
    assert "| Deadlines: non-served p50 ms | 20.000 | <= 100 | yes |" in text
