"""Scheduling benchmark (issue 23) with the real model: noisy neighbour, batch-class work beside
interactive calls, overload at 3x C, a burst of deadlines.

``python -m bench sched [--rounds R] [--duration S] [--flood X] [--burst N] [--quick]``

Set-up: one backend (real MiniLM, one inference thread) and one gateway (shipped defaults, a
tenants file with ``a``, ``b`` and ``bulk`` of class batch) pinned together to the first CPU,
the load generator on the last; every request a true miss (a unique text, ``no-store``). Short
texts are one sentence (~12 tokens), long ones ~300 words (cut to 256 tokens). Per round:

1. C: closed-loop capacity for short texts through the gateway (64 connections, tenant a).
2. Noisy neighbour: B alone at 0.3 C, then A at ``X`` x C (3) with B at 0.3 C in one open-loop
   stream (B's arrivals evenly spaced): B's goodput, B's p99 / B's p99 alone, (A + B) / C.
3. Batch beside interactive: B alone at 0.6 C, then B at 0.6 C with ``bulk`` (class batch:
   backend priority 3, as Batch API lines) at 1.0 C: B's p99 / alone, B's goodput, bulk's 2xx/s
   over the spare (C - 0.6 C). (The Batch API itself needs Redis: ``bench batch``.)
4. Overload: A alone at 0.7 C, then at 3 C: goodput (2xx/s over C), admitted p99 / p99 at 0.7 C.
5. Deadlines: C_long (closed loop, long texts, 16 connections), then ``N`` (300) long texts at
   once with ``X-Request-Timeout-Ms: 600``: served vs 0.9 x C_long x 0.6 s, none late, texts the
   backend computed during the burst vs those served, p50 of the non-served answers.

Every phase shows the CPU the gateway and backend used and what other processes took (a loaded
machine's figures do not decide). Reported, never a failure; exit code 1 when a server would not
start or a request got no answer at all. ("No loss vs raw ONNX Runtime": ``bench backend``.)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import loadgen, openloop, services
from bench.loadgen import LoadResult, Request
from bench.overload import scrape
from bench.procs import Cores, busy_seconds, pinned, split_cores, steal_seconds
from bench.sched_report import report
from bench.services import Server
from bench.tenants import Phase, mixed_schedule

ROUTE = "/v1/embeddings"
KEYS = {"a": "bench-sched-a-key-0000000000001", "b": "bench-sched-b-key-0000000000001",
        "bulk": "bench-sched-bulk-key-00000000001"}
WORDS = "the quick brown fox jumps over the lazy dog near the river bank "


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    rounds: int
    duration_s: float
    flood: float
    burst: int
    cores: Cores
    models: Path


@dataclass
class Burst:
    """The deadline burst's outcome."""

    c_long: float
    result: LoadResult
    computed: float  # texts the backend computed during the burst
    other_cpu: float


def parse(argv: Sequence[str]) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench sched",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (8)")
    parser.add_argument("--flood", type=float, default=3.0, help="A's load / C (3)")
    parser.add_argument("--burst", type=int, default=300, help="long texts at once (300)")
    parser.add_argument("--models", default="models", help="model repository (models)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s phases")
    args = parser.parse_args(argv)
    if min(args.rounds, args.duration, args.flood, args.burst) <= 0:
        parser.error("every number must be > 0")
    return Plan(rounds=1 if args.quick else args.rounds,
                duration_s=min(args.duration, 2.0) if args.quick else args.duration,
                flood=args.flood, burst=args.burst, cores=split_cores(),
                models=Path(args.models))


def short(tag: str, index: int) -> bytes:
    return orjson.dumps({"model": "minilm",
                         "input": f"sched {tag} {index}: how do I reset my password today?"})


def long(tag: str, index: int) -> bytes:
    return orjson.dumps({"model": "minilm", "input": f"sched {tag} {index} " + WORDS * 26})


def headers(tenant: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "Cache-Control": "no-store", **extra}


class Runner:
    """Runs the phases against one gateway and backend, measuring CPU around each."""

    def __init__(self, plan: Plan, gateway: Server, backend: Server) -> None:
        self.plan, self.gateway, self.backend = plan, gateway, backend
        self.url = f"{gateway.url}{ROUTE}"

    def closed(self, tag: str, body: Callable[[str, int], bytes], clients: int) -> float:
        json_a = {"Content-Type": "application/json", **headers("a")}
        result = loadgen.run(loadgen.run_closed(
            lambda i: Request(url=self.url, body=body(tag, i), headers=json_a),
            requests=100_000, concurrency=clients, max_duration_s=self.plan.duration_s))
        return result.throughput

    def opened(self, name: str, rnd: int, tag: str, rate: float,
               tenant_of: Callable[[int], str]) -> Phase:
        gateway = self.gateway

        def make(i: int) -> bytes:
            return openloop.request_bytes(gateway.host, gateway.port, ROUTE, short(tag, i),
                                          headers(tenant_of(i)))
        steal0, busy0, own0 = steal_seconds(), busy_seconds(), time.process_time()
        ours0 = gateway.service.cpu_seconds() + self.backend.service.cpu_seconds()
        result = openloop.run(gateway.host, gateway.port, make, rate_per_s=rate,
                              requests=int(rate * self.plan.duration_s),
                              max_duration_s=self.plan.duration_s, max_connections=1024,
                              timeout_s=10.0)
        wall = max(result.wall_s, 1e-9)
        ours = gateway.service.cpu_seconds() + self.backend.service.cpu_seconds() - ours0
        other = busy_seconds() - busy0 - ours - (time.process_time() - own0)
        return Phase(name, rnd, rate, result, tenant_of, (steal_seconds() - steal0) / wall,
                     ours / wall, max(0.0, other) / wall)

    def burst(self) -> Burst:
        c_long = self.closed("clong", long, 16)
        computed0 = _texts_computed(self.backend)
        busy0, own0 = busy_seconds(), time.process_time()
        ours0 = self.gateway.service.cpu_seconds() + self.backend.service.cpu_seconds()
        json_b = {"Content-Type": "application/json",
                  **headers("b", **{"X-Request-Timeout-Ms": "600"})}
        result = loadgen.run(loadgen.run_closed(
            lambda i: Request(url=self.url, body=long("burst", i), headers=json_b),
            requests=self.plan.burst, concurrency=self.plan.burst, max_duration_s=30.0))
        wall = max(result.wall_s, 1e-9)
        time.sleep(0.5)  # let batches already running finish before counting
        ours = self.gateway.service.cpu_seconds() + self.backend.service.cpu_seconds() - ours0
        other = busy_seconds() - busy0 - ours - (time.process_time() - own0)
        return Burst(c_long, result, _texts_computed(self.backend) - computed0,
                     max(0.0, other) / wall)

    def rounds(self) -> tuple[list[float], list[Phase], list[Burst]]:
        capacities: list[float] = []
        phases: list[Phase] = []
        bursts: list[Burst] = []
        flood = self.plan.flood
        with pinned(self.plan.cores.client):
            self.closed("warm", short, 64)
            for rnd in range(1, self.plan.rounds + 1):
                c = self.closed(f"c{rnd}", short, 64)
                capacities.append(c)
                phases.append(self.opened("B alone at 0.3x C", rnd, f"q{rnd}", 0.3 * c,
                                          lambda i: "b"))
                phases.append(self.opened(f"A at {flood:g}x C + B at 0.3x C", rnd, f"n{rnd}",
                                          (flood + 0.3) * c, mixed_schedule(flood, 0.3)))
                phases.append(self.opened("B alone at 0.6x C", rnd, f"i{rnd}", 0.6 * c,
                                          lambda i: "b"))
                phases.append(self.opened("B at 0.6x C + bulk (batch) at 1.0x C", rnd,
                                          f"x{rnd}", 1.6 * c, _named(mixed_schedule(1.0, 0.6),
                                                                     "bulk")))
                phases.append(self.opened("A alone at 0.7x C", rnd, f"s{rnd}", 0.7 * c,
                                          lambda i: "a"))
                phases.append(self.opened("A alone at 3x C", rnd, f"o{rnd}", 3.0 * c,
                                          lambda i: "a"))
                bursts.append(self.burst())
        return capacities, phases, bursts


def _named(schedule: Callable[[int], str], flood_name: str) -> Callable[[int], str]:
    """``mixed_schedule`` with its flooding tenant renamed."""
    return lambda i: flood_name if schedule(i) == "a" else "b"


def _texts_computed(backend: Server) -> float:
    return sum(scrape(backend.url, {"backend_batch_size_sum"}).values())


def tenants_file(directory: Path) -> Path:
    def digest(tenant: str) -> str:
        return hashlib.sha256(KEYS[tenant].encode()).hexdigest()

    path = directory / "tenants.yaml"
    path.write_text(textwrap.dedent(f"""
        tenants:
          a: {{api_keys_sha256: ["{digest('a')}"]}}
          b: {{api_keys_sha256: ["{digest('b')}"]}}
          bulk: {{api_keys_sha256: ["{digest('bulk')}"], priority: batch}}
    """), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    capacities: list[float] = []
    phases: list[Phase] = []
    bursts: list[Burst] = []
    try:
        with contextlib.ExitStack() as stack:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sched-")))
            backend = stack.enter_context(services.backend(plan.models, cores=plan.cores.server))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server,
                settings={"tenants_file": str(tenants_file(work))}))
            capacities, phases, bursts = Runner(plan, gateway, backend).rounds()
    except (RuntimeError, OSError) as exc:
        print(f"bench sched: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(report(plan.cores, plan.rounds, plan.duration_s, capacities, phases, bursts,
                     started))
        return 1
    print(report(plan.cores, plan.rounds, plan.duration_s, capacities, phases, bursts, started),
          flush=True)
    lost = any(s.status == 0 for p in phases for s in p.result.samples)
    return 1 if lost or math.isnan(capacities[0] if capacities else math.nan) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
