"""Noisy-neighbour benchmark (issue 14): tenant A floods at 5x capacity, tenant B sends 0.3x.

``python -m bench tenants [--slots 4] [--service-ms 40] [--tier-queue Q] [--rounds R]
[--duration S] [--flood X] [--quiet Y] [--nice N] [--quick]``

Set up like ``bench overload``: the deterministic fake backend (``bench.slow_backend``,
``slots`` x ``service_ms``), one gateway worker on the first CPU with ``tier_concurrency`` =
the slots, the fake and the load generator on the last one; every request a miss (unique text,
``Cache-Control: no-store``). A tenants file gives A and B an API key each, weight 1, no quota:
what protects B is admission's fair share, not a rate limit. The service time defaults to 40 ms
(C about 80-100 req/s): 5.3x C is then about 450 req/s, which one gateway core sheds with room
to spare on this 2-vCPU machine, so the figures measure admission, not a CPU-bound event loop
(at 20 ms the flood would be about 900 req/s). The queue holds one waiter per slot (4): room for
a few of B's requests arriving close together, each taking the place of one of A's. Per round:

1. Capacity C: closed loop, tenant A alone, ``tier_concurrency + tier_queue`` clients.
2. B alone at ``Y`` x C (0.3), open loop: B's baseline p99.
3. A at ``X`` x C (5) and B at ``Y`` x C together, open loop, one generator (B's requests
   evenly spaced among A's, so neither stream is bunched): B's goodput (2xx over sent) and p99,
   A's goodput.

``--nice N`` runs the gateway and the fake backend at that scheduling priority (root only for
N < 0): on a machine other work keeps busy, the gateway otherwise gets what is left of its core,
and the figures then measure that share rather than admission. The table shows the gateway's and
the other processes' CPU per phase either way.

Open-loop phases use ``bench/openloop.py`` (latency from the scheduled send time, kernel
receive timestamps). Targets, each the median over the rounds: B's goodput >= 0.95 of what it
sent; B's p99 <= 2x its p99 alone; A gets the rest (A's 2xx/s + B's 2xx/s >= 0.95 C). Reported,
never a failure; exit code 1 when a server would not start or a request got no answer at all.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import loadgen, openloop, services
from bench.loadgen import LoadResult, Request
from bench.overload import scrape
from bench.procs import Cores, busy_seconds, pinned, split_cores, steal_seconds
from bench.services import Server

ROUTE = "/v1/embeddings"
NO_STORE = {"Cache-Control": "no-store"}
KEYS = {"a": "bench-tenant-a-key-000000000001", "b": "bench-tenant-b-key-000000000001"}
TARGET_GOODPUT, TARGET_P99_RATIO, TARGET_REST = 0.95, 2.0, 0.95


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    slots: int
    service_ms: float
    tier_queue: int
    timeout_ms: int
    rounds: int
    duration_s: float
    flood: float
    quiet: float
    cores: Cores
    realtime: bool = True
    nice: int = 0

    def settings(self, tenants_file: str) -> dict[str, object]:
        """The gateway's settings (its config file), by dotted name."""
        return {"admission.tier_concurrency": self.slots, "admission.tier_queue": self.tier_queue,
                "default_timeout_ms": self.timeout_ms, "tenants_file": tenants_file}


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench tenants",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="fake backend slots (4)")
    parser.add_argument("--service-ms", type=float, default=40.0, help="fake service time (40)")
    parser.add_argument("--tier-queue", type=int, default=4,
                        help="gateway tier_queue (4: one per slot, room for B's bursts)")
    parser.add_argument("--timeout-ms", type=int, default=1000, help="default_timeout_ms (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (8)")
    parser.add_argument("--flood", type=float, default=5.0, help="tenant A's load / C (5)")
    parser.add_argument("--quiet", type=float, default=0.3, help="tenant B's load / C (0.3)")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s phases")
    parser.add_argument("--nice", type=int, default=0,
                        help="scheduling priority of the gateway and the fake backend (0)")
    parser.add_argument("--no-realtime", action="store_true",
                        help="run the open-loop generator at normal priority")
    args = parser.parse_args(argv)
    if min(args.slots, args.timeout_ms, args.rounds, args.duration, args.flood,
           args.quiet, args.service_ms) <= 0 or args.tier_queue < 0:
        parser.error("every number must be > 0 (--tier-queue >= 0)")
    return Plan(slots=args.slots, service_ms=args.service_ms, tier_queue=args.tier_queue,
                timeout_ms=args.timeout_ms, rounds=1 if args.quick else args.rounds,
                duration_s=min(args.duration, 3.0) if args.quick else args.duration,
                flood=args.flood, quiet=args.quiet, cores=split_cores(),
                realtime=not args.no_realtime, nice=args.nice)


def body(tag: str, index: int) -> bytes:
    """An embeddings request with a text unique to ``tag`` and ``index``: always a miss."""
    return orjson.dumps({"input": f"tenants {tag} {index}", "model": "minilm"})


def headers(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", **NO_STORE}


def mixed_schedule(flood: float, quiet: float) -> Callable[[int], str]:
    """Index -> tenant for one stream at ``flood + quiet`` x C: B's arrivals evenly spaced."""
    share = quiet / (flood + quiet)

    def tenant(index: int) -> str:
        return "b" if math.floor((index + 1) * share) > math.floor(index * share) else "a"
    return tenant


@dataclass
class Phase:
    """One measured phase."""

    name: str
    round: int
    offered: float
    result: LoadResult
    tenant_of: Callable[[int], str]
    steal: float
    gateway_cpu: float = 0.0  # cores
    other_cpu: float = 0.0  # cores used by processes outside the test (a shared machine's noise)

    def of(self, tenant: str) -> list[loadgen.Sample]:
        return [s for s in self.result.samples if self.tenant_of(s.index) == tenant]

    def statuses(self, tenant: str) -> dict[int, int]:
        """How many of ``tenant``'s requests got each status."""
        return dict(Counter(s.status for s in self.of(tenant)))

    def goodput(self, tenant: str) -> float:
        """2xx over sent (``nan`` when it sent nothing)."""
        mine = self.of(tenant)
        return sum(1 for s in mine if s.status == 200) / len(mine) if mine else math.nan

    def rate_2xx(self, tenant: str) -> float:
        ok = sum(1 for s in self.of(tenant) if s.status == 200)
        return ok / max(self.result.wall_s, 1e-9)

    def p(self, tenant: str, q: float) -> float:
        return loadgen.percentile([s.latency_s * 1000.0 for s in self.of(tenant)
                                   if s.status == 200], q)


def run_rounds(plan: Plan, gateway: Server,
               backend: Server) -> tuple[list[float], list[Phase]]:
    """A warm-up, then per round: capacity, B alone, A's flood with B."""
    url = f"{gateway.url}{ROUTE}"
    clients = plan.slots + plan.tier_queue
    cap = int(plan.slots * 1000.0 / plan.service_ms * plan.duration_s * 2) + 100
    capacities: list[float] = []
    phases: list[Phase] = []

    json_a = {"Content-Type": "application/json", **headers("a")}

    def closed(tag: str) -> LoadResult:
        return loadgen.run(loadgen.run_closed(
            lambda i: Request(url=url, body=body(tag, i), headers=json_a),
            requests=cap, concurrency=clients, max_duration_s=plan.duration_s))

    def opened(name: str, rnd: int, tag: str, rate: float,
               tenant_of: Callable[[int], str]) -> Phase:
        def make(i: int) -> bytes:
            return openloop.request_bytes(gateway.host, gateway.port, ROUTE, body(tag, i),
                                          headers(tenant_of(i)))
        steal0, busy0 = steal_seconds(), busy_seconds()
        gw0, fake0, own0 = (gateway.service.cpu_seconds(), backend.service.cpu_seconds(),
                            time.process_time())
        result = openloop.run(gateway.host, gateway.port, make, rate_per_s=rate,
                              requests=int(rate * plan.duration_s),
                              max_duration_s=plan.duration_s, max_connections=1024,
                              timeout_s=plan.timeout_ms / 1000.0 + 5.0, realtime=plan.realtime)
        wall = max(result.wall_s, 1e-9)
        gw = gateway.service.cpu_seconds() - gw0
        ours = gw + backend.service.cpu_seconds() - fake0 + time.process_time() - own0
        return Phase(name, rnd, rate, result, tenant_of,
                     (steal_seconds() - steal0) / wall, gw / wall,
                     max(0.0, busy_seconds() - busy0 - ours) / wall)

    with pinned(plan.cores.client):
        loadgen.run(loadgen.run_closed(
            lambda i: Request(url=url, body=body("warm", i), headers=json_a),
            requests=300, concurrency=clients, max_duration_s=30))
        for rnd in range(1, plan.rounds + 1):
            c = closed(f"c{rnd}").throughput
            capacities.append(c)
            phases.append(opened(f"B alone at {plan.quiet:g}x C", rnd, f"b{rnd}",
                                 plan.quiet * c, lambda i: "b"))
            phases.append(opened(f"A at {plan.flood:g}x C + B at {plan.quiet:g}x C", rnd,
                                 f"m{rnd}", (plan.flood + plan.quiet) * c,
                                 mixed_schedule(plan.flood, plan.quiet)))
    return capacities, phases


def tenants_file(directory: Path) -> Path:
    """A and B, one key each (stored as SHA-256), weight 1, no quota."""
    import hashlib

    path = directory / "tenants.yaml"
    path.write_text(textwrap.dedent(f"""
        tenants:
          a:
            api_keys_sha256: ["{hashlib.sha256(KEYS['a'].encode()).hexdigest()}"]
          b:
            api_keys_sha256: ["{hashlib.sha256(KEYS['b'].encode()).hexdigest()}"]
    """), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    capacities: list[float] = []
    phases: list[Phase] = []
    final: dict[str, float] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        with contextlib.ExitStack() as stack:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tenants-")))
            backend = stack.enter_context(services.slow_backend(
                cores=plan.cores.client, slots=plan.slots, service_ms=plan.service_ms))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server,
                settings=plan.settings(str(tenants_file(work)))))
            if plan.nice:
                for server in (gateway, backend):
                    os.setpriority(os.PRIO_PROCESS, server.service.pid, plan.nice)
            capacities, phases = run_rounds(plan, gateway, backend)
            final = scrape(gateway.url, {"gateway_shed_total", "gateway_tenant_requests_total"})
    except (RuntimeError, OSError) as exc:
        print(f"bench tenants: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(report(plan, capacities, phases, started, final))
        return 1
    print(report(plan, capacities, phases, started, final), flush=True)
    return 1 if any(s.status == 0 for p in phases for s in p.result.samples) else 0


def report(plan: Plan, capacities: list[float], phases: list[Phase], started: str,
           final: dict[str, float] | None = None) -> str:
    """The Markdown report: set-up, one row per phase and round, targets."""
    lines = [
        f"Run {started}. Machine: {os.cpu_count()} logical CPUs; Python "
        f"{platform.python_version()}. Pinning: {plan.cores.describe()} (the fake backend "
        "shares the load generator's CPU).",
        "",
        f"Backend: fake OIP, {plan.slots} slots x {plan.service_ms:g} ms. Gateway (1 worker): "
        f"tier_concurrency={plan.slots}, tier_queue={plan.tier_queue}, default_timeout_ms="
        f"{plan.timeout_ms}; tenants a and b, weight 1, no quota. Every request a miss. "
        f"Gateway and fake backend at nice {plan.nice}. "
        f"{plan.rounds} round(s) of {plan.duration_s:g} s phases; latency from the scheduled "
        "send time (`bench/openloop.py`). CPU columns in cores: the gateway's, and what "
        "processes outside the test took during the phase (a shared machine's noise).",
        "",
        "| round | phase | offered req/s | tenant | sent | 2xx | goodput | 2xx/s | p50 ms "
        "| p99 ms | 503 | other statuses | gateway CPU | other CPU | steal |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: | ---: | ---: |",
    ]
    for p in phases:
        for tenant in ("a", "b"):
            mine = p.of(tenant)
            if not mine:
                continue
            codes = p.statuses(tenant)
            other = {k: v for k, v in codes.items() if k not in (200, 503)}
            lines.append(
                f"| {p.round} | {p.name} | {p.offered:.0f} | {tenant.upper()} | {len(mine)} | "
                f"{codes.get(200, 0)} | {p.goodput(tenant):.3f} | {p.rate_2xx(tenant):.1f} | "
                f"{p.p(tenant, 50):.2f} | {p.p(tenant, 99):.2f} | {codes.get(503, 0)} | "
                f"{other or '-'} | {p.gateway_cpu:.2f} | {p.other_cpu:.2f} | {p.steal:.2f} |")
    pairs = [(phases[i], phases[i + 1]) for i in range(0, len(phases) - 1, 2)]
    if pairs:
        goodput = _median([m.goodput("b") for _a, m in pairs])
        ratio = _median([m.p("b", 99) / a.p("b", 99) for a, m in pairs])
        rest = _median([(m.rate_2xx("a") + m.rate_2xx("b")) / c
                        for (_a, m), c in zip(pairs, capacities, strict=False)])
        lines += [
            "",
            f"| target (median over {len(pairs)} round(s)) | measured | goal | met |",
            "| --- | ---: | ---: | :---: |",
            _target("B's goodput under A's flood (2xx / sent)", goodput, TARGET_GOODPUT, True),
            _target("B's p99 under the flood / B's p99 alone", ratio, TARGET_P99_RATIO, False),
            _target("A gets the rest: (A + B 2xx/s) / C", rest, TARGET_REST, True),
            "",
            f"- C per round: {', '.join(f'{c:.1f}' for c in capacities)} req/s.",
        ]
    if final:
        shown = ", ".join(f"`{k}` {v:g}" for k, v in sorted(final.items()) if v)
        lines.append(f"- Gateway metrics at the end (all phases): {shown}.")
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else math.nan


def _target(name: str, value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    return f"| {name} | {value:.3f} | {'>=' if at_least else '<='} {goal:g} | " \
           f"{'yes' if met else 'NO'} |"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
