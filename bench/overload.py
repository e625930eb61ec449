"""Overload benchmark (issue 5): capacity C, then 0.7x C and 3x C offered at a fixed rate.

``python -m bench overload [--slots 4] [--service-ms 20] [--tier-concurrency N]
[--tier-queue Q] [--timeout-ms T] [--duration S] [--overload X] [--quick]``

The backend is the deterministic fake (``bench.slow_backend``): ``slots`` requests at a time,
``service_ms`` each, so the capacity under test is the gateway's admission control and not the
real model's CPU use, which on a 2-core machine would compete with the gateway and the load
generator and move with them. The gateway (1 worker) gets the first CPU; the load generator and
the fake backend the last one. Every request is a miss (a unique text and ``Cache-Control:
no-store``, so it neither hits nor coalesces nor fills the cache).

1. Capacity C: closed loop with ``tier_concurrency + tier_queue`` clients (enough to keep every
   slot busy, too few to be shed), successful responses per second.
2. 0.7x C, open loop (requests at fixed intervals; latency from the scheduled time, so queueing
   is not hidden): the baseline p99.
3. ``X`` x C (3), open loop: goodput (2xx per second), p99 of admitted requests, p99 of shed
   (503) answers, and whether each 503 carried ``Retry-After``.

Targets (reported, never a failure): goodput >= 0.95 C; admitted p99 <= 2x the p99 at 0.7 C;
shed p99 <= 2 ms. Exit code 1 when a server would not start or a transport error happened.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import loadgen, services
from bench.loadgen import LoadResult, Reply, Request, RequestFactory
from bench.procs import Cores, pinned, split_cores
from bench.services import Server

MODEL = "minilm"
HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-store"}
TARGET_GOODPUT, TARGET_P99_RATIO, TARGET_SHED_MS = 0.95, 2.0, 2.0


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    slots: int
    service_ms: float
    tier_concurrency: int
    tier_queue: int
    timeout_ms: int
    duration_s: float  # each phase's time cap
    overload: float
    cores: Cores

    def settings(self) -> dict[str, int]:
        """The gateway's admission settings (its config file)."""
        return {"tier_concurrency": self.tier_concurrency, "tier_queue": self.tier_queue,
                "default_timeout_ms": self.timeout_ms}


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench overload",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="fake backend slots (4)")
    parser.add_argument("--service-ms", type=float, default=20.0, help="fake service time (20)")
    parser.add_argument("--tier-concurrency", type=int,
                        help="gateway tier_concurrency (default: --slots)")
    parser.add_argument("--tier-queue", type=int,
                        help="gateway tier_queue (default: half of tier_concurrency)")
    parser.add_argument("--timeout-ms", type=int, default=1000,
                        help="gateway default_timeout_ms (1000)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase (10)")
    parser.add_argument("--overload", type=float, default=3.0, help="offered load / C (3)")
    parser.add_argument("--quick", action="store_true", help="short phases (smoke test)")
    args = parser.parse_args(argv)
    concurrency = args.tier_concurrency or args.slots
    queue = args.tier_queue if args.tier_queue is not None else max(1, concurrency // 2)
    if min(args.slots, concurrency, args.timeout_ms, args.duration, args.overload) <= 0:
        parser.error("slots, concurrency, timeout, duration and overload must be > 0")
    if queue < 0 or args.service_ms < 0:
        parser.error("--tier-queue and --service-ms must be >= 0")
    return Plan(
        slots=args.slots, service_ms=args.service_ms, tier_concurrency=concurrency,
        tier_queue=queue, timeout_ms=args.timeout_ms,
        duration_s=min(args.duration, 3.0) if args.quick else args.duration,
        overload=args.overload, cores=split_cores(),
    )


def factory(url: str, phase: str) -> RequestFactory:
    """Requests with a text unique to ``phase`` and index: every one a miss."""
    def make(index: int) -> Request:
        body = orjson.dumps({"input": f"overload {phase} request {index}", "model": MODEL})
        return Request(url=url, body=body, headers=HEADERS)
    return make


def retry_after(reply: Reply) -> Mapping[str, float]:
    """1.0 under ``retry_after`` when a 503 carries a ``Retry-After`` header."""
    if reply.status == 503:
        return {"retry_after": float("Retry-After" in reply.headers)}
    return {}


@dataclass
class Phase:
    """One measured phase and what the gateway spent on it."""

    name: str
    offered: float  # req/s offered (closed loop: nan)
    result: LoadResult
    gateway_cpu: float  # cores

    def statuses(self, code: int) -> list[float]:
        """Latencies (ms) of the samples with HTTP status ``code``."""
        return [s.latency_s * 1000.0 for s in self.result.samples if s.status == code]

    @property
    def goodput(self) -> float:
        return self.result.throughput

    @property
    def lag_p99(self) -> float:
        """How late the generator sent, p99 (ms): open-loop latency counts from the schedule,
        so a late generator shows up in every latency column."""
        return loadgen.percentile([s.lag_s * 1000.0 for s in self.result.samples], 99)


def run_phases(plan: Plan, gateway: Server) -> list[Phase]:
    """Warm-up, capacity, 0.7x C and overload, in that order."""
    url = f"{gateway.url}/v1/embeddings"
    clients = plan.tier_concurrency + plan.tier_queue
    per_s = plan.slots * 1000.0 / max(plan.service_ms, 0.1)
    cap = int(per_s * plan.duration_s * 2) + 100  # count bound well past what time allows
    phases: list[Phase] = []

    async def measured(name: str, offered: float, make: RequestFactory,
                       run: str) -> Phase:
        cpu0 = gateway.service.cpu_seconds()
        if run == "closed":
            result = await loadgen.run_closed(make, requests=cap, concurrency=clients,
                                              max_duration_s=plan.duration_s)
        else:
            result = await loadgen.run_open(
                make, rate_per_s=offered, requests=int(offered * plan.duration_s),
                max_duration_s=plan.duration_s + 1.0, max_in_flight=4096,
                inspect=retry_after)
        cpu = (gateway.service.cpu_seconds() - cpu0) / max(result.wall_s, 1e-9)
        return Phase(name, offered, result, cpu)

    async def go() -> None:
        await loadgen.run_closed(factory(url, "warm"), requests=200, concurrency=clients,
                                 max_duration_s=30)
        capacity = await measured("capacity C (closed loop)", float("nan"),
                                  factory(url, "capacity"), "closed")
        phases.append(capacity)
        c = capacity.goodput
        phases.append(await measured("0.7x C (open loop)", 0.7 * c, factory(url, "base"),
                                     "open"))
        phases.append(await measured(f"{plan.overload:g}x C (open loop)", plan.overload * c,
                                     factory(url, "over"), "open"))

    loadgen.run(go())
    return phases


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    phases: list[Phase] = []
    rss: tuple[int, int] = (0, 0)
    try:
        with contextlib.ExitStack() as stack:
            backend = stack.enter_context(services.slow_backend(
                cores=plan.cores.client, slots=plan.slots, service_ms=plan.service_ms))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server, settings=plan.settings()))
            before = _rss_kib(gateway)
            with pinned(plan.cores.client):
                phases = run_phases(plan, gateway)
            rss = (before, _rss_kib(gateway))
    except (RuntimeError, OSError) as exc:
        print(f"bench overload: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(report(plan, phases, rss))
        return 1
    print(report(plan, phases, rss), flush=True)
    transport = sum(1 for p in phases for s in p.result.samples if s.status == 0)
    return 1 if transport else 0


def report(plan: Plan, phases: list[Phase], rss: tuple[int, int]) -> str:
    """The Markdown report: settings, one row per phase, targets."""
    settings = ", ".join(f"{k}={v}" for k, v in plan.settings().items())
    lines = [
        f"Machine: {os.cpu_count()} logical CPUs; Python {platform.python_version()}. "
        f"Pinning: {plan.cores.describe()} (the fake backend shares the load generator's CPU).",
        "",
        f"Backend: fake OIP, {plan.slots} slots x {plan.service_ms:g} ms. Gateway (1 worker): "
        f"{settings}. Every request a miss (unique text, `Cache-Control: no-store`). Each "
        f"phase capped at {plan.duration_s:g} s.",
        "",
        "| phase | offered req/s | sent | 2xx/s | 2xx p50 ms | 2xx p99 ms | 503 | 503 p99 ms "
        "| other | send lag p99 ms | gateway CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in phases:
        shed = p.statuses(503)
        other = {k: v for k, v in p.result.status_counts().items() if k not in (200, 503)}
        lines.append(
            f"| {p.name} | {_num(p.offered, 0)} | {len(p.result.samples)} | {p.goodput:.1f} | "
            f"{p.result.latency_ms(50):.1f} | {p.result.latency_ms(99):.1f} | {len(shed)} | "
            f"{_num(loadgen.percentile(shed, 99), 2)} | {other or '-'} | {_num(p.lag_p99, 2)} | "
            f"{p.gateway_cpu:.2f} |")
    lines.append("")
    if len(phases) == 3:
        capacity, base, over = phases
        shed = over.statuses(503)
        shed_p99 = loadgen.percentile(shed, 99) if shed else float("nan")
        p99_ratio = over.result.latency_ms(99) / base.result.latency_ms(99)
        with_retry = sum(1 for s in over.result.samples
                         if s.status == 503 and s.info and s.info.get("retry_after"))
        lines += [
            "| target | measured | goal | met |",
            "| --- | ---: | ---: | :---: |",
            _target("goodput at overload / C", over.goodput / capacity.goodput, TARGET_GOODPUT,
                    True),
            _target("admitted p99 at overload / p99 at 0.7x C", p99_ratio, TARGET_P99_RATIO,
                    False),
            _target("shed (503) p99, ms", shed_p99, TARGET_SHED_MS, False),
            "",
            f"- C = {capacity.goodput:.1f} req/s (ideal {plan.slots * 1000 / plan.service_ms:.0f}"
            f"); open-loop generator shed {over.result.shed} arrival(s) itself (0 = it kept "
            "its schedule).",
            f"- 503s carrying Retry-After: {with_retry}/{len(shed)}.",
            f"- Gateway RSS: {rss[0] / 1024:.1f} MiB before the phases, {rss[1] / 1024:.1f} MiB "
            "after.",
        ]
    return "\n".join(lines)


def _rss_kib(server: Server) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{server.service.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _num(value: float, digits: int) -> str:
    return "-" if value != value else f"{value:.{digits}f}"


def _target(name: str, value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    sign = ">=" if at_least else "<="
    return f"| {name} | {value:.3f} | {sign} {goal:g} | {'yes' if met else 'NO'} |"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
