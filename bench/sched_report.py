"""The Markdown report of ``python -m bench sched``: how C was found, one row per phase and
tenant (with the CPU the hypervisor gave other machines, ``steal``), the Batch API batch, the
burst, and the issue's targets (medians over the rounds), with
the extra open-loop variants in rows of their own."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import loadgen
from bench.loadgen import LoadResult
from bench.procs import Cores
from bench.tenants import Phase

DEADLINE_S = 0.6

# Phase keys, in the order a round runs them. The set-up:
QUIET_03 = "b-alone-0.3"  # B alone at 0.3 C
NOISY = "noisy"  # A closed loop on 64 connections + B open loop at 0.3 C
QUIET_06 = "b-alone-0.6"  # B alone at 0.6 C
BATCH = "batch"  # B open loop at 0.6 C while a Batch API batch runs (tenant bulk)
LOAD_07 = "a-0.7"  # A alone at 0.7 C
OVERLOAD = "a-3x"  # A alone at 3 C
# Extra rows (the earlier open-loop variants and the evenly busy phase, not the set-up):
EVEN = "even"  # C's closed loop with tenants a and b in turn (run right after C)
NOISY_OPEN = "noisy-open"  # A open loop at --flood x C + B at 0.3 C, one stream
BULK_OPEN = "bulk-open"  # B at 0.6 C + bulk (batch class) open loop at 1.0 C, one stream

Row = tuple[str, list[float], float, bool]  # target name, values per round, goal, "at least"


@dataclass(frozen=True)
class Setup:
    """What the run was asked to do (for the report's first lines)."""

    cores: Cores
    rounds: int
    duration_s: float
    flood: float
    flood_clients: int
    lines: int
    settings: tuple[tuple[str, str], ...] = ()


@dataclass
class Calibration:
    """C's connection count: closed-loop 2xx/s and statuses for each count tried."""

    tried: dict[int, LoadResult] = field(default_factory=dict)

    @property
    def best(self) -> int:
        """The count with the most 2xx answers per second (the fewer connections on a tie)."""
        if not self.tried:
            raise ValueError("no connection count was tried")
        return min(self.tried, key=lambda n: (-self.tried[n].throughput, n))

    def describe(self) -> str:
        if not self.tried:
            return "C was not measured (the run ended before its warm-up did)."
        shown = "; ".join(f"{n} connections: {r.throughput:.1f} 2xx/s, statuses "
                          f"{r.status_counts()}" for n, r in sorted(self.tried.items()))
        return (f"C is the closed-loop capacity in 2xx answers per second (tenant a, short "
                f"texts) at the connection count that gave the most in the warm-up ({shown}): "
                f"{self.best} connections.")


@dataclass
class Burst:
    """The deadline burst's outcome."""

    c_long: float
    result: LoadResult
    computed: float  # texts the backend computed during the burst
    other_cpu: float


@dataclass
class BatchRun:
    """The Batch API batch beside B: lines completed (and failed) while B ran."""

    lines: int
    before: int  # lines completed before B started (the batch alone, ramping up)
    completed: int  # completed while B ran
    failed: int  # failed while B ran
    seconds: float  # between the two reads of the batch's counts
    status: str  # after the cancel ("completed": it ran out of lines, the rate is a floor)
    deferred: dict[str, float] = field(default_factory=dict)
    """The gateway's batch gate refusals while B ran, by reason (gateway_batch_deferred_total)."""

    @property
    def rate(self) -> float:
        """Completed lines per second while B ran."""
        return self.completed / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class CoreSplit:
    """How the server core was shared over one phase: each server's CPU and what the
    backend computed (its ``backend_batch_size`` histogram's sum and count)."""

    wall_s: float
    gateway_s: float  # CPU seconds
    backend_s: float
    answers: int  # 2xx answers of the phase's own loops (not Batch API lines)
    texts: float
    batches: float

    @property
    def texts_per_batch(self) -> float:
        return self.texts / self.batches if self.batches else math.nan

    @property
    def backend_ms_per_answer(self) -> float:
        return 1000.0 * self.backend_s / self.answers if self.answers else math.nan


@dataclass
class Round:
    """One round: C, its phases by key, the batch and the burst; ``cores``: the core's split
    per phase name (C's closed loop included)."""

    number: int
    c: float
    phases: dict[str, Phase] = field(default_factory=dict)
    batch: BatchRun | None = None
    burst: Burst | None = None
    cores: dict[str, CoreSplit] = field(default_factory=dict)


def report(setup: Setup, calibration: Calibration, rounds: list[Round], started: str) -> str:
    lines = [
        f"Run {started}. Machine: {os.cpu_count()} logical CPUs; Python "
        f"{platform.python_version()}. Pinning: {setup.cores.describe()} (backend and gateway "
        "share the server CPU; the Redis the Batch API needs and A's flood process are on the "
        "load generator's). Real MiniLM, one inference thread; gateway shipped defaults with a "
        "tenants file (a, b, bulk of class batch) and `batch.redis_url` set"
        + "".join(f", `{k}: {v}`" for k, v in setup.settings) + ". Every request a miss. "
        f"{setup.rounds} round(s) of {setup.duration_s:g} s phases. A's flood: closed "
        f"loop on {setup.flood_clients} connections, every answer followed at once by the next "
        f"request. The batch: {setup.lines} one-text lines through /v1/files + /v1/batches "
        "(tenant bulk), cancelled after its phase. CPU columns in cores: gateway + backend, and "
        "what processes outside the test took (figures from a loaded machine do not decide).",
        "",
        f"- {calibration.describe()}",
        "",
        "| round | phase | offered req/s | tenant | sent | 2xx | goodput | 2xx/s | p50 ms "
        "| p99 ms | 503 | other statuses | ours CPU | other CPU | steal |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: | ---: | ---: |",
    ]
    for r in rounds:
        for p in r.phases.values():
            lines += _phase_rows(p)
    lines += _where_b_waits(rounds)
    lines += _where_the_core_goes(rounds)
    batches = [(r.number, r.c, r.batch) for r in rounds if r.batch is not None]
    if batches:
        lines += ["", "| round | batch lines | completed before B | completed while B ran "
                  "| failed | seconds | lines/s | spare (C - 0.6 C) req/s | lines/s / spare "
                  "| status after cancel | gate refusals while B ran |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
                  "| --- |"]
        for number, c, run in batches:
            lines.append(f"| {number} | {run.lines} | {run.before} | {run.completed} | "
                         f"{run.failed} | {run.seconds:.1f} | {run.rate:.1f} | {0.4 * c:.1f} | "
                         f"{_ratio(run.rate, 0.4 * c):.3f} | {run.status} | "
                         f"{_reasons(run.deferred)} |")
    bursts = [(r.number, r.burst) for r in rounds if r.burst is not None]
    if bursts:
        lines += ["", "| round | C_long req/s | burst | served | late | 503 | 504 | other "
                  "| non-served p50 ms | texts computed | computed / served | other CPU |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: "
                  "| ---: |"]
    for number, b in bursts:
        samples = b.result.samples
        served = [s for s in samples if s.status == 200]
        late = [s for s in served if s.latency_s > DEADLINE_S]
        missed = [s.latency_s * 1000 for s in samples if s.status != 200]
        odd = {s.status for s in samples if s.status not in (200, 503, 504)}
        lines.append(
            f"| {number} | {b.c_long:.1f} | {len(samples)} | {len(served)} | {len(late)} | "
            f"{sum(s.status == 503 for s in samples)} | {sum(s.status == 504 for s in samples)} "
            f"| {sorted(odd) or '-'} | {loadgen.percentile(missed, 50):.1f} | "
            f"{b.computed:.0f} | {b.computed / max(1, len(served)):.2f} | {b.other_cpu:.2f} |")
    lines += _targets(rounds)
    return "\n".join(lines)


#: The phases whose B answers ``_where_b_waits`` splits by stage.
B_PHASES = (QUIET_03, NOISY, QUIET_06, BATCH)


def b_stages(p: Phase) -> dict[str, list[float]]:
    """B's 2xx answers in ``p`` split by ``Server-Timing`` (ms): the backend's queue (the
    batch computing when the call came) and compute (its own batch), the gateway's part
    (its ``total`` less those two: policy, lookups, admission wait, the hop) and the time
    before the gateway's clock started (the generator's latency less ``total``: the sockets
    and the gateway's event loop reaching the request)."""
    stages: dict[str, list[float]] = {"backend queue": [], "backend compute": [],
                                      "gateway": [], "before the gateway": []}
    for s in p.of("b"):
        info = s.info or {}
        if s.status != 200 or "t_total" not in info:
            continue
        queue, compute = info.get("t_queue", 0.0), info.get("t_compute", 0.0)
        stages["backend queue"].append(queue)
        stages["backend compute"].append(compute)
        stages["gateway"].append(info["t_total"] - queue - compute)
        stages["before the gateway"].append(s.latency_s * 1000.0 - info["t_total"])
    return stages


def _where_b_waits(rounds: list[Round]) -> list[str]:
    """A table of B's time by stage (p50 / p99 ms) in each round's B phases."""
    rows = []
    for r in rounds:
        for key in B_PHASES:
            p = r.phases.get(key)
            if p is None:
                continue
            stages = b_stages(p)
            if not stages["gateway"]:
                continue
            cells = " | ".join(f"{loadgen.percentile(v, 50):.1f} / {loadgen.percentile(v, 99):.1f}"
                               for v in stages.values())
            rows.append(f"| {r.number} | {p.name} | {len(stages['gateway'])} | {cells} |")
    if not rows:
        return []
    return ["", "Where B's time goes, from each answer's `Server-Timing` (p50 / p99 ms):", "",
            "| round | phase | answers | backend queue | backend compute | gateway "
            "| before the gateway |", "| ---: | --- | ---: | --- | --- | --- | --- |", *rows]


def _where_the_core_goes(rounds: list[Round]) -> list[str]:
    """A table of the server core's split per phase: C's closed loop keeps the backend's
    queue full (full batches), an open loop at the same rate does not, and at 3x C the
    gateway's refusals take their share of the core."""
    rows = []
    for r in rounds:
        for name, split in r.cores.items():
            wall = max(split.wall_s, 1e-9)
            rows.append(f"| {r.number} | {name} | {split.gateway_s / wall:.2f} | "
                        f"{split.backend_s / wall:.2f} | {split.answers} | "
                        f"{split.backend_ms_per_answer:.2f} | {split.texts_per_batch:.2f} |")
    if not rows:
        return []
    return ["", "Where the server core goes (cores from /proc; texts and batches from the "
            "backend's `backend_batch_size`; a Batch API phase's lines are computed but not "
            "in its answers):", "",
            "| round | phase | gateway cores | backend cores | 2xx answers "
            "| backend CPU ms / answer | texts / batch |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: |", *rows]


def _reasons(counts: dict[str, float]) -> str:
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items()) if v)
    return shown or "-"


def _phase_rows(p: Phase) -> list[str]:
    rows = []
    for tenant in ("a", "b", "bulk"):
        mine = p.of(tenant)
        if not mine:
            continue
        codes = p.statuses(tenant)
        other = {k: v for k, v in codes.items() if k not in (200, 503)}
        rows.append(
            f"| {p.round} | {p.name} | {_offered(p.offered)} | {tenant} | {len(mine)} | "
            f"{codes.get(200, 0)} | {p.goodput(tenant):.3f} | {p.rate_2xx(tenant):.1f} | "
            f"{p.p(tenant, 50):.2f} | {p.p(tenant, 99):.2f} | {codes.get(503, 0)} | "
            f"{other or '-'} | {p.gateway_cpu:.2f} | {p.other_cpu:.2f} | {p.steal:.2f} |")
    return rows


def _offered(rate: float) -> str:
    """A phase's offered rate; "closed" for a closed loop (nan: it sends as fast as answered)."""
    return "closed" if math.isnan(rate) else f"{rate:.0f}"


def _each(rounds: list[Round], keys: tuple[str, ...],
          value: Callable[..., float]) -> list[float]:
    """``value(round, *phases)`` for every round that ran all of ``keys``."""
    return [value(r, *(r.phases[k] for k in keys)) for r in rounds
            if all(k in r.phases for k in keys)]


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _targets(rounds: list[Round]) -> list[str]:
    if not rounds:
        return []

    def noisy(key: str, label: str) -> list[Row]:
        return [
            (f"{label}: B goodput", _each(rounds, (key,), lambda r, m: m.goodput("b")), 0.95,
             True),
            (f"{label}: B p99 / B alone", _each(rounds, (QUIET_03, key), lambda r, q, m: _ratio(
                m.p("b", 99), q.p("b", 99))), 2.0, False),
            (f"{label}: (A + B) 2xx/s / C", _each(rounds, (key,), lambda r, m: _ratio(
                m.rate_2xx("a") + m.rate_2xx("b"), r.c)), 0.85, True),
        ]

    def beside(key: str, label: str, spare: Callable[[Round, Phase], float]) -> list[Row]:
        return [
            (f"{label}: B p99 / B alone", _each(rounds, (QUIET_06, key), lambda r, q, m: _ratio(
                m.p("b", 99), q.p("b", 99))), 1.5, False),
            (f"{label}: B goodput", _each(rounds, (key,), lambda r, m: m.goodput("b")), 0.99,
             True),
            (f"{label}: batch lines/s / (C - 0.6 C)", _each(rounds, (key,), spare), 0.6, True),
        ]

    def api_rate(r: Round, _m: Phase) -> float:
        return _ratio(r.batch.rate, 0.4 * r.c) if r.batch is not None else math.nan

    rows: list[Row] = [
        *noisy(NOISY, "Noisy (A closed loop)"),
        *beside(BATCH, "Batch API beside B", api_rate),
        ("Overload 3x C: 2xx/s / C", _each(rounds, (OVERLOAD,), lambda r, o: _ratio(
            o.rate_2xx("a"), r.c)), 0.9, True),
        ("Overload 3x C: p99 / p99 at 0.7 C", _each(rounds, (LOAD_07, OVERLOAD),
                                                    lambda r, s, o: _ratio(o.p("a", 99),
                                                                           s.p("a", 99))),
         2.0, False),
    ]
    for r in rounds:
        b = r.burst
        if b is None:
            continue
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
    extra: list[Row] = [
        ("Extra, A and B evenly busy: (A + B) 2xx/s / C", _each(rounds, (EVEN,), lambda r, e:
            _ratio(e.rate_2xx("a") + e.rate_2xx("b"), r.c)), 0.95, True),
        *noisy(NOISY_OPEN, "Extra, A open loop"),
        *beside(BULK_OPEN, "Extra, bulk open loop", lambda r, m: _ratio(
            m.rate_2xx("bulk"), 0.4 * r.c)),
    ]
    lines = ["", "| target (median over rounds) | measured | goal | met |",
             "| --- | ---: | ---: | :---: |"]
    lines += [_row(*row) for row in _merge(rows)]
    shown = [_row(*row) for row in _merge(extra) if row[1]]
    if shown:
        lines += ["", "| extra, not the issue's set-up (open-loop variants, two tenants evenly "
                  "busy) | measured | goal "
                  "| met |", "| --- | ---: | ---: | :---: |", *shown]
    lines.append(f"\n- C per round: {', '.join(f'{r.c:.1f}' for r in rounds)} 2xx/s.")
    spread = c_spread(rounds)
    if spread > C_SPREAD:
        lines.append(f"- **C moved {spread:.0%} between rounds** (more than {C_SPREAD:.0%}): the "
                     "machine's speed changed during the run, and every ratio to C moves with "
                     "it; read the absolute figures, or run again.")
    return lines


#: How far C may move between rounds before the report says the ratios to C do not decide.
C_SPREAD = 0.15


def c_spread(rounds: list[Round]) -> float:
    """(largest C - smallest C) / smallest C over the rounds that measured one (0 with fewer
    than two)."""
    cs = [r.c for r in rounds if r.c > 0 and not math.isnan(r.c)]
    return (max(cs) - min(cs)) / min(cs) if len(cs) > 1 else 0.0


def _merge(rows: list[Row]) -> list[Row]:
    """Rows of one name (the burst's, one per round) as one row over the rounds."""
    merged: dict[str, Row] = {}
    for name, values, goal, at_least in rows:
        if name in merged:
            merged[name][1].extend(values)
        else:
            merged[name] = (name, list(values), goal, at_least)
    return list(merged.values())


def _row(name: str, values: list[float], goal: float, at_least: bool) -> str:
    clean = [v for v in values if not math.isnan(v)]
    value = statistics.median(clean) if clean else math.nan
    met = value >= goal if at_least else value <= goal
    return (f"| {name} | {value:.3f} | {'>=' if at_least else '<='} {goal:g} | "
            f"{'yes' if met else 'NO'} |")
