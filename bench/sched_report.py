"""The Markdown report of ``python -m bench sched``: one row per phase and tenant, the burst,
and the issue's targets (medians over the rounds)."""

from __future__ import annotations

import math
import os
import platform
import statistics
from typing import TYPE_CHECKING

from bench import loadgen
from bench.procs import Cores
from bench.tenants import Phase

if TYPE_CHECKING:
    from bench.sched import Burst

PER_ROUND = 6  # phases per round, in bench/sched.py's order
DEADLINE_S = 0.6


def report(cores: Cores, rounds: int, duration_s: float, capacities: list[float],
           phases: list[Phase], bursts: list[Burst], started: str) -> str:
    lines = [
        f"Run {started}. Machine: {os.cpu_count()} logical CPUs; Python "
        f"{platform.python_version()}. Pinning: {cores.describe()} (backend and gateway share "
        "the server CPU). Real MiniLM, one inference thread; gateway shipped defaults with a "
        "tenants file (a, b, bulk of class batch). Every request a miss. "
        f"{rounds} round(s) of {duration_s:g} s phases. CPU columns in cores: gateway + backend, "
        "and what processes outside the test took (figures from a loaded machine do not decide).",
        "",
        "| round | phase | offered req/s | tenant | sent | 2xx | goodput | 2xx/s | p50 ms "
        "| p99 ms | 503 | other statuses | ours CPU | other CPU |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: | ---: |",
    ]
    for p in phases:
        for tenant in ("a", "b", "bulk"):
            mine = p.of(tenant)
            if not mine:
                continue
            codes: dict[int, int] = {}
            for s in mine:
                codes[s.status] = codes.get(s.status, 0) + 1
            other = {k: v for k, v in codes.items() if k not in (200, 503)}
            lines.append(
                f"| {p.round} | {p.name} | {p.offered:.0f} | {tenant} | {len(mine)} | "
                f"{codes.get(200, 0)} | {p.goodput(tenant):.3f} | {p.rate_2xx(tenant):.1f} | "
                f"{p.p(tenant, 50):.2f} | {p.p(tenant, 99):.2f} | {codes.get(503, 0)} | "
                f"{other or '-'} | {p.gateway_cpu:.2f} | {p.other_cpu:.2f} |")
    lines += ["", "| round | C_long req/s | burst | served | late | 503 | 504 | other "
              "| non-served p50 ms | texts computed | computed / served | other CPU |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: "
              "| ---: |"]
    for rnd, b in enumerate(bursts, start=1):
        samples = b.result.samples
        served = [s for s in samples if s.status == 200]
        late = [s for s in served if s.latency_s > DEADLINE_S]
        missed = [s.latency_s * 1000 for s in samples if s.status != 200]
        odd = {s.status for s in samples if s.status not in (200, 503, 504)}
        lines.append(
            f"| {rnd} | {b.c_long:.1f} | {len(samples)} | {len(served)} | {len(late)} | "
            f"{sum(s.status == 503 for s in samples)} | {sum(s.status == 504 for s in samples)} "
            f"| {sorted(odd) or '-'} | {loadgen.percentile(missed, 50):.1f} | "
            f"{b.computed:.0f} | {b.computed / max(1, len(served)):.2f} | {b.other_cpu:.2f} |")
    lines += _targets(capacities, phases, bursts)
    return "\n".join(lines)


def _targets(capacities: list[float], phases: list[Phase], bursts: list[Burst]) -> list[str]:
    rounds = [phases[i:i + PER_ROUND] for i in range(0, len(phases), PER_ROUND)]
    rounds = [r for r in rounds if len(r) == PER_ROUND]
    if not rounds:
        return []
    cs = capacities[:len(rounds)]
    rows = [
        ("Noisy: B goodput", [r[1].goodput("b") for r in rounds], 0.95, True),
        ("Noisy: B p99 / B alone", [r[1].p("b", 99) / r[0].p("b", 99) for r in rounds], 2.0,
         False),
        ("Noisy: (A + B) 2xx/s / C", [(r[1].rate_2xx("a") + r[1].rate_2xx("b")) / c
                                      for r, c in zip(rounds, cs, strict=False)], 0.85, True),
        ("Batch beside: B p99 / B alone", [r[3].p("b", 99) / r[2].p("b", 99) for r in rounds],
         1.5, False),
        ("Batch beside: B goodput", [r[3].goodput("b") for r in rounds], 0.99, True),
        ("Batch beside: bulk 2xx/s / (C - 0.6 C)",
         [r[3].rate_2xx("bulk") / (0.4 * c) for r, c in zip(rounds, cs, strict=False)], 0.6,
         True),
        ("Overload 3x C: 2xx/s / C", [r[5].rate_2xx("a") / c
                                      for r, c in zip(rounds, cs, strict=False)], 0.9, True),
        ("Overload 3x C: p99 / p99 at 0.7 C", [r[5].p("a", 99) / r[4].p("a", 99)
                                               for r in rounds], 2.0, False),
    ]
    for b in bursts:
        served = sum(s.status == 200 for s in b.result.samples)
        rows += [
            ("Deadlines: served / (0.9 x C_long x 0.6 s)", [served / (0.9 * b.c_long * 0.6)],
             1.0, True),
            ("Deadlines: late (count)", [float(sum(s.status == 200 and s.latency_s > DEADLINE_S
                                                   for s in b.result.samples))], 0.0, False),
            ("Deadlines: computed / served", [b.computed / max(1, served)], 1.1, False),
            ("Deadlines: non-served p50 ms", [loadgen.percentile(
                [s.latency_s * 1000 for s in b.result.samples if s.status != 200], 50)],
             100.0, False),
        ]
    lines = ["", "| target (median over rounds) | measured | goal | met |",
             "| --- | ---: | ---: | :---: |"]
    for name, values, goal, at_least in rows:
        clean = [v for v in values if not math.isnan(v)]
        value = statistics.median(clean) if clean else math.nan
        met = value >= goal if at_least else value <= goal
        lines.append(f"| {name} | {value:.3f} | {'>=' if at_least else '<='} {goal:g} | "
                     f"{'yes' if met else 'NO'} |")
    lines.append(f"\n- C per round: {', '.join(f'{c:.1f}' for c in capacities)} req/s.")
    return lines
