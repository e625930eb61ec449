"""The microbenchmarks run through the bench runner (what `make bench` calls) and print tables."""

from __future__ import annotations

import pytest

from bench.__main__ import main as bench_main


@pytest.mark.parametrize("name", ["policy", "cache"])
def test_microbench_runs_quick(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([name, "--quick"]) == 0
    out = capsys.readouterr().out
    assert f"## bench {name}" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 3  # header + measurements
    assert all(any(ch.isdigit() for ch in row) for row in rows[1:])
