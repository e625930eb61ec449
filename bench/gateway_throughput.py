"""Throughput rounds with wrk, interleaved across servers, with the CPU each side used.

The gateway bench compares servers that run one after another on the same CPU; to keep a shared
machine's drift from favouring one of them, every round runs each server once in turn, and the
median round counts. Beside wrk's figures a ``Row`` keeps how many cores the server (its
process and its children: nginx's worker) and wrk itself used, so a report can show which side
was the bottleneck, and how much CPU other processes took (a shared machine's noise).
"""

from __future__ import annotations

import resource
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench import wrk
from bench.procs import busy_seconds
from bench.services import Server


@dataclass
class Row:
    """One measured server: every timed run and the CPU used in each."""

    name: str
    runs: list[wrk.WrkResult] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # server cores used per run
    client_cpu: list[float] = field(default_factory=list)  # wrk's cores used per run
    other_cpu: list[float] = field(default_factory=list)  # cores other processes used
    note: str = ""

    @property
    def rps(self) -> float:
        """Median requests per second over the timed runs (0 before any)."""
        return statistics.median(r.rps for r in self.runs) if self.runs else 0.0

    @property
    def median(self) -> wrk.WrkResult | None:
        """The run with the median throughput."""
        if not self.runs:
            return None
        return sorted(self.runs, key=lambda r: r.rps)[len(self.runs) // 2]

    @property
    def errors(self) -> int:
        """Transport errors and non-2xx answers over every timed run."""
        return sum(r.errors + r.non_2xx for r in self.runs)

    def markdown(self) -> str:
        """One table row (see ``HEADER``)."""
        m = self.median
        if m is None:
            return f"| {self.name} | - | - | - | - | - | - | - | - |"
        cpu, client, other = (statistics.median(v) if v else float("nan")
                              for v in (self.cpu, self.client_cpu, self.other_cpu))
        return (f"| {self.name} | {self.rps:.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | "
                f"{cpu:.2f} | {client:.2f} | {other:.2f} | "
                f"{m.bytes_read / max(1, m.requests):.0f} | {self.errors} |")


HEADER = ["| server (cache hit) | req/s | p50 ms | p99 ms | server CPU | wrk CPU | other CPU "
          "| bytes/answer | errors |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

Target = tuple[Row, Server, Sequence[bytes], str]  # row, server, bodies, path


def measure(targets: Sequence[Target], *, headers: Mapping[str, str], connections: int,
            duration_s: float, warmup_s: float, rounds: int, cores: frozenset[int]) -> None:
    """A warm-up run per target, then ``rounds`` rounds of one timed run per target, in
    turn; results go into each target's ``Row``."""
    def one(row: Row, server: Server, bodies: Sequence[bytes], path: str, seconds: float,
            keep: bool) -> None:
        cpu0, child0, busy0 = server.service.cpu_seconds(), _children_cpu(), busy_seconds()
        result = wrk.run(server.url, path, bodies, headers=headers, connections=connections,
                         duration_s=seconds, cores=cores)
        if keep:
            served = server.service.cpu_seconds() - cpu0
            client = _children_cpu() - child0
            row.runs.append(result)
            row.cpu.append(served / result.duration_s)
            row.client_cpu.append(client / result.duration_s)
            others = busy_seconds() - busy0 - served - client
            row.other_cpu.append(max(0.0, others) / result.duration_s)

    for row, server, bodies, path in targets:
        one(row, server, bodies, path, warmup_s, keep=False)
    for _ in range(rounds):
        for row, server, bodies, path in targets:
            one(row, server, bodies, path, duration_s, keep=True)


def _children_cpu() -> float:
    """CPU seconds of every finished child (wrk is the only one reaped during a run)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
