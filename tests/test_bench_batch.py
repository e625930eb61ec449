"""The batch benchmark's plan and report (bench/batch.py); the run itself is ``python -m bench
batch`` (minutes, not a test)."""

from __future__ import annotations

import pytest

from bench import batch


def test_defaults_and_quick() -> None:
    plan = batch.parse([])
    assert (plan.slots, plan.lines, plan.rounds, plan.share) == (4, 10_000, 3, 0.5)
    assert plan.concurrency == plan.slots
    settings = plan.settings()
    assert settings["batch.max_lines"] == 10_000 and settings["batch.share"] == 0.5
    quick = batch.parse(["--quick", "--share", "1.0"])
    assert (quick.lines, quick.rounds, quick.duration_s, quick.share) == (2000, 1, 5.0, 1.0)
    with pytest.raises(SystemExit):
        batch.parse(["--lines", "0"])


def test_report_computes_the_targets() -> None:
    plan = batch.parse(["--rounds", "1"])
    met = batch.Round(capacity=150.0, base_p99=40.0, base_goodput=105.0, with_p99=44.0,
                      with_goodput=105.0, batch_rate=40.0, statuses={200: 1575},
                      ideal=200.0, noise=(0.1, 0.0, 0.1, 0.0))
    text = batch.report(plan, [met], ["a note"])
    assert "| interactive p99 with batch / without | 1.100 | <= 1.2 | yes |" in text
    assert "| batch lines/s / spare capacity | 0.889 | >= 0.8 | yes |" in text
    assert text.endswith("- a note")
    missed = batch.Round(capacity=150.0, base_p99=40.0, base_goodput=105.0, with_p99=60.0,
                         with_goodput=105.0, batch_rate=10.0, statuses={200: 1575},
                         ideal=200.0, noise=(0.1, 0.0, 0.1, 0.0))
    text = batch.report(plan, [missed], [])
    assert "| 1.500 | <= 1.2 | NO |" in text and "| 0.222 | >= 0.8 | NO |" in text
