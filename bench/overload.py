"""Overload benchmark (issue 5): capacity C, then 0.7x C and 3x C offered at a fixed rate.

``python -m bench overload [--slots 4] [--service-ms 20] [--tier-concurrency N]
[--tier-queue Q] [--timeout-ms T] [--rounds R] [--duration S] [--overload X] [--quick]``

The backend is the deterministic fake (``bench.slow_backend``): ``slots`` requests at a time,
``service_ms`` each, so the capacity under test is set by the gateway's admission control and
not by the real model's CPU use, which on a 2-core machine would compete with the gateway and
the load generator and move with them. The gateway (1 worker) gets the first CPU; the load
generator and the fake backend the last one. Every request is a miss (a unique text and
``Cache-Control: no-store``: it neither hits nor coalesces nor fills the cache).

Each of ``R`` rounds (3) runs four phases of ``S`` seconds (5):

1. Capacity C: closed loop with ``tier_concurrency + tier_queue`` clients (enough to keep every
   slot busy, too few to be shed), successful responses per second.
2. 0.7x C, open loop (requests at fixed intervals; latency counts from the scheduled time, so
   queueing is not hidden): the baseline p99.
3. ``X`` x C (3), open loop: goodput (2xx per second), p99 of admitted requests, p99 of the
   shed (503) answers, and whether each 503 carried ``Retry-After``.
4. The floor: the same requests at the same rate to a bare aiohttp hello-world on the gateway's
   core, the p99 any aiohttp server gets on this machine at that moment.

Open-loop phases use ``bench/openloop.py`` (nanosleep to each send time, kernel receive
timestamps, real-time priority when allowed); the table also shows each phase's steal time.
``--adaptive`` turns on the gateway's adaptive concurrency limit (``tier_concurrency``, default
64 then, is its ceiling).

Targets, each the median over the rounds of that round's figure (one noisy round on a shared
machine does not decide): goodput >= 0.95 C; admitted p99 <= 2x the p99 at 0.7x C; shed p99
<= 2 ms. Reported, never a failure; exit code 1 when a server would not start or a request got
no answer at all.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import loadgen, openloop, services
from bench.gateway_probe import metric_samples
from bench.loadgen import LoadResult, Request, RequestFactory
from bench.procs import Cores, busy_seconds, pinned, split_cores, steal_seconds
from bench.services import Server

MODEL = "minilm"
ROUTE = "/v1/embeddings"
NO_STORE = {"Cache-Control": "no-store"}  # no cache read or write: every request a miss
HEADERS = {"Content-Type": "application/json", **NO_STORE}
TARGET_GOODPUT, TARGET_P99_RATIO, TARGET_SHED_MS = 0.95, 2.0, 2.0


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    slots: int
    service_ms: float
    tier_concurrency: int
    tier_queue: int
    timeout_ms: int
    rounds: int
    duration_s: float  # each phase's time cap
    overload: float
    cores: Cores
    realtime: bool = True  # the open-loop generator at SCHED_FIFO priority when allowed
    adaptive: bool = False  # the gateway's adaptive concurrency limit, tier_concurrency its cap

    @property
    def clients(self) -> int:
        """Closed-loop clients for C: every backend slot busy plus the queue, nobody shed."""
        slots = self.slots if self.adaptive else self.tier_concurrency
        return slots + self.tier_queue

    def settings(self) -> dict[str, int | bool]:
        """The gateway's admission settings (its config file), by dotted name."""
        settings = {"admission.tier_concurrency": self.tier_concurrency,
                    "admission.tier_queue": self.tier_queue,
                    "default_timeout_ms": self.timeout_ms}
        if self.adaptive:
            settings["admission.adaptive.enabled"] = True
        return settings


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench overload",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="fake backend slots (4)")
    parser.add_argument("--service-ms", type=float, default=20.0, help="fake service time (20)")
    parser.add_argument("--tier-concurrency", type=int,
                        help="gateway tier_concurrency (default: --slots)")
    parser.add_argument("--tier-queue", type=int,
                        help="gateway tier_queue (default: a quarter of --slots, >= 1)")
    parser.add_argument("--timeout-ms", type=int, default=1000,
                        help="gateway default_timeout_ms (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (3)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase (5)")
    parser.add_argument("--overload", type=float, default=3.0, help="offered load / C (3)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s phases")
    parser.add_argument("--adaptive", action="store_true",
                        help="turn on the gateway's adaptive concurrency limit; "
                             "--tier-concurrency (default 64) is then its ceiling")
    parser.add_argument("--no-realtime", action="store_true",
                        help="run the open-loop generator at normal priority")
    args = parser.parse_args(argv)
    concurrency = args.tier_concurrency or (64 if args.adaptive else args.slots)
    queue = args.tier_queue if args.tier_queue is not None else max(1, args.slots // 4)
    if min(args.slots, concurrency, args.timeout_ms, args.rounds, args.duration,
           args.overload) <= 0:
        parser.error("slots, concurrency, timeout, rounds, duration, overload must be > 0")
    if queue < 0 or args.service_ms <= 0:
        parser.error("--tier-queue must be >= 0 and --service-ms > 0")
    return Plan(
        slots=args.slots, service_ms=args.service_ms, tier_concurrency=concurrency,
        tier_queue=queue, timeout_ms=args.timeout_ms, rounds=1 if args.quick else args.rounds,
        duration_s=min(args.duration, 2.0) if args.quick else args.duration,
        overload=args.overload, cores=split_cores(), realtime=not args.no_realtime,
        adaptive=args.adaptive,
    )


def body(phase: str, index: int) -> bytes:
    """An embeddings request with a text unique to ``phase`` and ``index``."""
    return orjson.dumps({"input": f"overload {phase} request {index}", "model": MODEL})


def factory(url: str, phase: str) -> RequestFactory:
    """Requests with a text unique to ``phase`` and index: every one a miss."""
    def make(index: int) -> Request:
        return Request(url=url, body=body(phase, index), headers=HEADERS)
    return make


@dataclass
class Phase:
    """One measured phase and the gateway CPU it used."""

    name: str
    round: int
    offered: float  # req/s offered (closed loop: nan)
    result: LoadResult
    gateway_cpu: float  # cores
    other_cpu: float  # cores used by processes other than the gateway, fake and generator
    steal: float = 0.0  # cores' worth of time the hypervisor gave to other VMs

    def latencies(self, code: int, *, from_send: bool = False) -> list[float]:
        """Latencies (ms) of the samples with HTTP status ``code``: from the schedule, or
        from the moment the generator actually sent."""
        return [(s.latency_s - (s.lag_s if from_send else 0.0)) * 1000.0
                for s in self.result.samples if s.status == code]

    def p99(self, code: int, *, from_send: bool = False) -> float:
        return loadgen.percentile(self.latencies(code, from_send=from_send), 99)

    @property
    def goodput(self) -> float:
        return self.result.throughput

    @property
    def lag_p99(self) -> float:
        """How late the generator sent, p99 (ms)."""
        return loadgen.percentile([s.lag_s * 1000.0 for s in self.result.samples], 99)


def run_rounds(plan: Plan, gateway: Server, backend: Server, floor: Server) -> list[Phase]:
    """A warm-up, then per round: capacity, 0.7x C, overload (C of that round) and the floor."""
    url = f"{gateway.url}{ROUTE}"
    clients = plan.clients
    ideal = plan.slots * 1000.0 / plan.service_ms
    cap = int(ideal * plan.duration_s * 2) + 100  # a count bound well past what time allows
    phases: list[Phase] = []

    def measured(name: str, rnd: int, offered: float, target: Server, tag: str) -> Phase:
        cpu0, fake0, own0 = target.service.cpu_seconds(), backend.service.cpu_seconds(), \
            time.process_time()
        busy0, steal0 = busy_seconds(), steal_seconds()
        result: LoadResult
        if math.isnan(offered):
            result = loadgen.run(loadgen.run_closed(
                factory(url, tag), requests=cap, concurrency=clients,
                max_duration_s=plan.duration_s))
        else:
            result = openloop.run(
                target.host, target.port, wire_factory(target, tag), rate_per_s=offered,
                requests=int(offered * plan.duration_s), max_duration_s=plan.duration_s,
                max_connections=1024, timeout_s=plan.timeout_ms / 1000.0 + 5.0,
                realtime=plan.realtime)
        wall = max(result.wall_s, 1e-9)
        used = target.service.cpu_seconds() - cpu0
        fake = backend.service.cpu_seconds() - fake0 if target is gateway else 0.0
        ours = used + fake + time.process_time() - own0
        return Phase(name, rnd, offered, result, used / wall,
                     max(0.0, busy_seconds() - busy0 - ours) / wall,
                     (steal_seconds() - steal0) / wall)

    with pinned(plan.cores.client):
        loadgen.run(loadgen.run_closed(factory(url, "warm"), requests=300, concurrency=clients,
                                       max_duration_s=30))
        for rnd in range(1, plan.rounds + 1):
            capacity = measured("capacity C, closed loop", rnd, math.nan, gateway, f"c{rnd}")
            c = capacity.goodput
            base = measured("0.7x C, open loop", rnd, 0.7 * c, gateway, f"b{rnd}")
            over = measured(f"{plan.overload:g}x C, open loop", rnd, plan.overload * c,
                            gateway, f"o{rnd}")
            hello = measured(f"floor: hello-world at {plan.overload:g}x C", rnd,
                             plan.overload * c, floor, f"f{rnd}")
            phases.extend((capacity, base, over, hello))
    return phases


def wire_factory(target: Server, phase: str) -> Callable[[int], bytes]:
    """The open-loop generator's requests: whole HTTP/1.1 requests, unique per index."""
    def make(index: int) -> bytes:
        return openloop.request_bytes(target.host, target.port, ROUTE, body(phase, index),
                                      NO_STORE)
    return make


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    phases: list[Phase] = []
    rss: tuple[int, int] = (0, 0)
    final: dict[str, float] = {}
    try:
        with contextlib.ExitStack() as stack:
            backend = stack.enter_context(services.slow_backend(
                cores=plan.cores.client, slots=plan.slots, service_ms=plan.service_ms))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server, settings=plan.settings()))
            floor = stack.enter_context(services.hello(cores=plan.cores.server))
            before = _rss_kib(gateway)
            phases = run_rounds(plan, gateway, backend, floor)
            rss = (before, _rss_kib(gateway))
            final = scrape(gateway.url, {"gateway_concurrency_limit",
                                         "gateway_adaptive_min_rtt_seconds",
                                         "gateway_shed_total"})
    except (RuntimeError, OSError) as exc:
        print(f"bench overload: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(report(plan, phases, rss, final))
        return 1
    print(report(plan, phases, rss, final), flush=True)
    transport = sum(1 for p in phases for s in p.result.samples if s.status == 0)
    return 1 if transport else 0


def scrape(base_url: str, names: Collection[str]) -> dict[str, float]:
    """``name{labels}`` -> value for the samples named ``names`` on ``/metrics``."""
    found: dict[str, float] = {}
    for sample in metric_samples(base_url, names):
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
        found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def report(plan: Plan, phases: list[Phase], rss: tuple[int, int],
           final: Mapping[str, float] | None = None) -> str:
    """The Markdown report: settings, one row per phase and round, targets."""
    settings = ", ".join(f"{k}={v}" for k, v in plan.settings().items())
    opened = [p.result for p in phases if isinstance(p.result, openloop.Result)]
    stamps = "kernel receive timestamps (SO_TIMESTAMPNS)" if opened and all(
        r.kernel_stamps for r in opened) else "receive times read from the clock"
    priority = "real-time (SCHED_FIFO 1)" if opened and all(r.realtime for r in opened) \
        else "normal"
    lines = [
        f"Machine: {os.cpu_count()} logical CPUs; Python {platform.python_version()}. "
        f"Pinning: {plan.cores.describe()} (the fake backend shares the load generator's CPU; "
        "the hello-world floor server gets the gateway's).",
        "",
        f"Backend: fake OIP, {plan.slots} slots x {plan.service_ms:g} ms (ideal "
        f"{plan.slots * 1000 / plan.service_ms:.0f} req/s). Gateway (1 worker): {settings}"
        f"{' (adaptive limit: tier_concurrency is its ceiling)' if plan.adaptive else ''}. "
        f"Every request a miss (unique text, `Cache-Control: no-store`). {plan.rounds} "
        f"round(s) of four {plan.duration_s:g} s phases. Open-loop phases: `bench/openloop.py`, "
        f"{stamps}, generator priority {priority}. Latency counts from the scheduled send "
        "time; 'send lag' is how late the generator was; 'other CPU' is what processes outside "
        "the test used (a shared machine's noise; 0 when it was quiet), 'steal' the part of "
        "it the hypervisor gave to other VMs (in cores). The floor phase sends "
        "the same requests at the same rate to a bare aiohttp hello-world on the gateway's CPU: "
        "the latency any aiohttp server has here before doing any work.",
        "",
        "| round | phase | offered req/s | sent | 2xx/s | 2xx p50 ms | 2xx p99 ms | 503 "
        "| 503 p99 ms | 503 p99 from send, ms | send lag p99 ms | other statuses | server CPU "
        "| other CPU | steal |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: | ---: | ---: |",
    ]
    for p in phases:
        other = {k: v for k, v in p.result.status_counts().items() if k not in (200, 503)}
        shed = p.latencies(503)
        lines.append(
            f"| {p.round} | {p.name} | {_num(p.offered, 0)} | {len(p.result.samples)} | "
            f"{p.goodput:.1f} | {p.result.latency_ms(50):.2f} | {p.result.latency_ms(99):.2f} "
            f"| {len(shed)} | {_num(p.p99(503), 2)} | {_num(p.p99(503, from_send=True), 2)} | "
            f"{_num(p.lag_p99, 2)} | {other or '-'} | {p.gateway_cpu:.2f} | "
            f"{p.other_cpu:.2f} | {p.steal:.2f} |")
    lines.append("")
    rounds = [phases[i:i + 4] for i in range(0, len(phases) - 3, 4)]
    if rounds:
        goodput = _median([o.goodput / c.goodput for c, _b, o, _f in rounds])
        ratio = _median([o.result.latency_ms(99) / b.result.latency_ms(99)
                         for _c, b, o, _f in rounds])
        shed_p99 = _median([o.p99(503) for _c, _b, o, _f in rounds])
        shed_send = _median([o.p99(503, from_send=True) for _c, _b, o, _f in rounds])
        floor_p99 = _median([f.result.latency_ms(99) for _c, _b, _o, f in rounds])
        over_floor = _median([o.p99(503) / f.result.latency_ms(99) for _c, _b, o, f in rounds])
        sheds = [s for _c, _b, o, _f in rounds for s in o.result.samples if s.status == 503]
        with_retry = sum(1 for s in sheds if s.info and s.info.get("retry_after"))
        skipped = sum(o.result.shed + b.result.shed for _c, b, o, _f in rounds)
        lines += [
            f"| target (median over {len(rounds)} round(s)) | measured | goal | met |",
            "| --- | ---: | ---: | :---: |",
            _target("goodput at overload / C", goodput, TARGET_GOODPUT, True),
            _target("admitted p99 at overload / p99 at 0.7x C", ratio, TARGET_P99_RATIO, False),
            _target("shed (503) p99, ms", shed_p99, TARGET_SHED_MS, False),
            f"| shed (503) p99 from the actual send, ms (info) | {shed_send:.3f} | - | - |",
            f"| floor: hello-world p99 at the same rate, ms (info) | {floor_p99:.3f} | - | - |",
            f"| shed p99 / floor p99, same round (info) | {over_floor:.2f} | - | - |",
            "",
            f"- C per round: {', '.join(f'{c.goodput:.1f}' for c, _b, _o, _f in rounds)} "
            f"req/s; the open-loop generator skipped {skipped} arrival(s) itself (0 = it never "
            "ran out of connections).",
            f"- 503s carrying Retry-After: {with_retry}/{len(sheds)}.",
            f"- Gateway RSS: {rss[0] / 1024:.1f} MiB before the rounds, {rss[1] / 1024:.1f} MiB "
            "after.",
        ]
    if final:
        shown = ", ".join(f"`{k}` {v:g}" for k, v in sorted(final.items()))
        lines.append(f"- Gateway metrics at the end: {shown}.")
    return "\n".join(lines)


def _rss_kib(server: Server) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{server.service.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _median(values: list[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else math.nan


def _num(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _target(name: str, value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    sign = ">=" if at_least else "<="
    return f"| {name} | {value:.3f} | {sign} {goal:g} | {'yes' if met else 'NO'} |"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
