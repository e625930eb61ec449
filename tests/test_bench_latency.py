"""bench latency's account of the other processes' CPU (the runs themselves need the model
and a quiet machine: bench/RESULTS.md)."""

from __future__ import annotations

from bench.latency import QUIET_CORES, others_line
from bench.procs import other_cores


def test_other_cores_are_the_machines_busy_time_less_ours_over_the_wall_time() -> None:
    # 10 s wall; the machine was busy 13 CPU-seconds, ours took 12: others held 0.1 cores.
    assert abs(other_cores((100.0, 50.0, 0.0), (113.0, 62.0, 10.0)) - 0.1) < 1e-9
    # Ours can read a tick above the machine's (different clocks): never below zero.
    assert other_cores((100.0, 50.0, 0.0), (110.0, 61.0, 10.0)) == 0.0
    assert other_cores((100.0, 50.0, 5.0), (110.0, 60.0, 5.0)) == 0.0


def test_a_run_beside_busy_processes_says_it_decides_nothing() -> None:
    assert "quiet enough to decide" in others_line(QUIET_CORES)
    assert "NOT deciding" in others_line(QUIET_CORES + 0.01)
    assert others_line(0.024).startswith("Other processes held 0.02 cores")
