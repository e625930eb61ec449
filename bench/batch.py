"""Batch jobs against interactive traffic (issue 13): ``python -m bench batch``.

``python -m bench batch [--slots 4] [--service-ms 20] [--lines 10000] [--duration 15]
[--rounds 3] [--share 0.5] [--concurrency N] [--quick]``

A real gateway (1 worker) with a real Redis in front of the fake fixed-capacity backend
(``bench.slow_backend``: ``slots`` x ``service_ms``, so capacity does not move with the CPU
the gateway and the generator use on a small machine); every interactive request is a miss
(unique text, ``Cache-Control: no-store``) and every batch line a miss (unique texts).
Admission: ``tier_concurrency`` = slots (the backend's real parallelism), a deep queue.

Each round:

1. Capacity C: closed loop, interactive only.
2. Baseline: 0.7x C open loop (``bench/openloop.py``, latency from the scheduled send time),
   interactive p99 without a batch.
3. A ``lines``-line batch is uploaded and created through the Files/Batches API, then the same
   0.7x C open loop runs while it executes: interactive p99 with the batch, and the batch's
   lines per second over the phase (request counts read before and after).
4. The batch is cancelled (the next round's baseline runs without it); in the last round it runs
   to the end instead, and its output is checked: every line exactly once.

Targets (medians over the rounds): interactive p99 with the batch <= 1.2x the baseline p99;
batch lines/s >= 0.8x the spare capacity (C minus the interactive goodput of phase 3).
Reported, never a failure; exit code 1 when a server would not start.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import orjson

from bench import loadgen, openloop, services
from bench.batch_api import BatchClient
from bench.loadgen import Request, RequestFactory
from bench.overload import scrape
from bench.procs import Cores, busy_seconds, pinned, split_cores, steal_seconds
from bench.services import Server

ROUTE = "/v1/embeddings"
NO_STORE = {"Cache-Control": "no-store"}
TARGET_P99_RATIO, TARGET_SPARE_SHARE = 1.2, 0.8


@dataclass(frozen=True)
class Plan:
    """One run, from the command line."""

    slots: int
    service_ms: float
    lines: int
    duration_s: float
    rounds: int
    share: float
    concurrency: int
    cores: Cores

    def settings(self) -> dict[str, object]:
        return {"admission.tier_concurrency": self.slots, "admission.tier_queue": 256,
                "default_timeout_ms": 5000, "logging.level": "WARNING",
                "cache.node.enabled": False,
                "batch.max_lines": max(self.lines, 1), "batch.max_file_bytes": 256 * 1024 * 1024,
                "batch.share": self.share, "batch.concurrency": self.concurrency,
                "batch.max_stored_bytes": 4 * 1024 * 1024 * 1024}


def parse(argv: Sequence[str]) -> Plan:
    p = argparse.ArgumentParser(prog="python -m bench batch",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--slots", type=int, default=4, help="fake backend slots (4)")
    p.add_argument("--service-ms", type=float, default=20.0, help="fake service time (20)")
    p.add_argument("--lines", type=int, default=10_000, help="lines in the batch (10000)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per phase (15)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    p.add_argument("--share", type=float, default=0.5, help="batch.share (0.5, its default)")
    p.add_argument("--concurrency", type=int, help="batch.concurrency (default: --slots)")
    p.add_argument("--quick", action="store_true", help="1 round, 5 s phases, 2000 lines")
    a = p.parse_args(argv)
    if min(a.slots, a.service_ms, a.lines, a.duration, a.rounds) <= 0:
        p.error("slots, service-ms, lines, duration and rounds must be > 0")
    return Plan(slots=a.slots, service_ms=a.service_ms,
                lines=2000 if a.quick else a.lines, duration_s=5.0 if a.quick else a.duration,
                rounds=1 if a.quick else a.rounds, share=a.share,
                concurrency=a.concurrency or a.slots, cores=split_cores())


def _body(tag: str, index: int) -> bytes:
    return orjson.dumps({"model": "minilm", "input": f"batch bench {tag} request {index}"})


def _wire(server: Server, tag: str) -> Callable[[int], bytes]:
    def make(index: int) -> bytes:
        return openloop.request_bytes(server.host, server.port, ROUTE, _body(tag, index),
                                      NO_STORE)
    return make


def _closed(server: Server, tag: str) -> RequestFactory:
    def make(index: int) -> Request:
        return Request(url=f"{server.url}{ROUTE}", body=_body(tag, index),
                       headers={"Content-Type": "application/json", **NO_STORE})
    return make


@dataclass
class Round:
    """One round's figures."""

    capacity: float
    base_p99: float
    base_goodput: float
    with_p99: float
    with_goodput: float
    batch_rate: float
    statuses: dict[int, int]
    ideal: float
    noise: tuple[float, float, float, float]
    """Other processes' CPU and steal (cores) in the baseline, then in the batch phase."""

    @property
    def spare(self) -> float:
        return max(self.capacity - self.with_goodput, 1e-9)

    @property
    def ideal_spare(self) -> float:
        return max(self.ideal - self.with_goodput, 1e-9)


class Noise:
    """CPU that processes outside the test used during a phase, and hypervisor steal (cores):
    busy time minus what the test's own servers and this generator used."""

    def __init__(self, servers: Sequence[Server]) -> None:
        self.servers = servers
        self.start = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        ours = sum(s.service.cpu_seconds() for s in self.servers) + time.process_time()
        return busy_seconds(), ours, steal_seconds(), time.monotonic()

    def cores(self) -> tuple[float, float]:
        busy, ours, steal, now = self._read()
        wall = max(now - self.start[3], 1e-9)
        return (max(0.0, busy - self.start[0] - (ours - self.start[1])) / wall,
                (steal - self.start[2]) / wall)


def run_round(plan: Plan, server: Server, api: BatchClient, rnd: int, last: bool,
              notes: list[str], servers: Sequence[Server]) -> Round:
    cap = int(plan.slots * 1000 / plan.service_ms * plan.duration_s * 2) + 100
    closed = loadgen.run(loadgen.run_closed(_closed(server, f"c{rnd}"), requests=cap,
                                            concurrency=plan.slots * 4,
                                            max_duration_s=plan.duration_s))
    c = closed.throughput

    def open_phase(tag: str) -> openloop.Result:
        return openloop.run(server.host, server.port, _wire(server, tag), rate_per_s=0.7 * c,
                            requests=int(0.7 * c * plan.duration_s),
                            max_duration_s=plan.duration_s, max_connections=1024, timeout_s=10.0)

    noise = Noise(servers)
    base = open_phase(f"b{rnd}")
    base_noise = noise.cores()
    batch_id = api.start(plan.lines, f"r{rnd}")
    done0, t0 = api.done(batch_id), time.monotonic()
    noise = Noise(servers)
    with_batch = open_phase(f"w{rnd}")
    with_noise = noise.cores()
    done1, t1 = api.done(batch_id), time.monotonic()
    rate = (done1 - done0) / max(t1 - t0, 1e-9)
    if last:
        start = time.monotonic()
        final = api.finish(batch_id, timeout_s=plan.lines / max(c * 0.05, 1.0) + 60)
        ids = api.output_ids(final.get("output_file_id")) + \
            api.output_ids(final.get("error_file_id"))
        once = len(ids) == len(set(ids)) == plan.lines
        notes.append(f"round {rnd}: the batch ended {final['status']} "
                     f"{time.monotonic() - start:.1f} s after the phase (no interactive load); "
                     f"output + error lines {len(ids)}, distinct custom_ids {len(set(ids))}, "
                     f"every line exactly once: {'yes' if once else 'NO'}")
    else:
        api.http.post(f"/batches/{batch_id}/cancel")
        api.finish(batch_id, timeout_s=120)
    return Round(c, base.latency_ms(99), base.throughput, with_batch.latency_ms(99),
                 with_batch.throughput, rate, with_batch.status_counts(),
                 plan.slots * 1000 / plan.service_ms, (*base_noise, *with_noise))


def report(plan: Plan, rounds: list[Round], notes: list[str]) -> str:
    lines = [
        f"Backend: fake OIP, {plan.slots} slots x {plan.service_ms:g} ms (ideal "
        f"{plan.slots * 1000 / plan.service_ms:.0f} req/s). Gateway (1 worker) + Redis; "
        f"admission.tier_concurrency={plan.slots}, batch.share={plan.share:g}, "
        f"batch.concurrency={plan.concurrency}. Batch: {plan.lines} lines, one text each. "
        f"{plan.rounds} round(s) of {plan.duration_s:g} s phases; {plan.cores.describe()}.",
        "",
        "| round | C req/s | base 2xx/s | base p99 ms | with batch 2xx/s | with batch p99 ms "
        "| p99 ratio | spare req/s (C - 2xx/s) | batch lines/s | batch / spare "
        "| batch / (ideal - 2xx/s) | statuses with batch | other CPU, steal: base; with |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| --- |",
    ]
    for i, r in enumerate(rounds, 1):
        n = r.noise
        lines.append(
            f"| {i} | {r.capacity:.1f} | {r.base_goodput:.1f} | {r.base_p99:.2f} | "
            f"{r.with_goodput:.1f} | {r.with_p99:.2f} | {r.with_p99 / r.base_p99:.2f} | "
            f"{r.spare:.1f} | {r.batch_rate:.1f} | {r.batch_rate / r.spare:.2f} | "
            f"{r.batch_rate / r.ideal_spare:.2f} | {r.statuses} | "
            f"{n[0]:.2f}, {n[1]:.2f}; {n[2]:.2f}, {n[3]:.2f} |")
    if rounds:
        ratio = statistics.median(r.with_p99 / r.base_p99 for r in rounds)
        share = statistics.median(r.batch_rate / r.spare for r in rounds)
        lines += ["", "| target (median over rounds) | measured | goal | met |",
                  "| --- | ---: | ---: | :---: |",
                  f"| interactive p99 with batch / without | {ratio:.3f} | <= "
                  f"{TARGET_P99_RATIO:g} | {'yes' if ratio <= TARGET_P99_RATIO else 'NO'} |",
                  f"| batch lines/s / spare capacity | {share:.3f} | >= {TARGET_SPARE_SHARE:g} "
                  f"| {'yes' if share >= TARGET_SPARE_SHARE else 'NO'} |"]
    lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    plan = parse(argv)
    rounds: list[Round] = []
    notes: list[str] = []
    code = 0
    try:
        with contextlib.ExitStack() as stack:
            redis = stack.enter_context(services.redis(cores=plan.cores.client))
            backend = stack.enter_context(services.slow_backend(
                cores=plan.cores.client, slots=plan.slots, service_ms=plan.service_ms))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server, redis_url=services.redis_url(redis),
                settings=plan.settings(), name="batch-gateway"))
            api = BatchClient(gateway)
            stack.callback(api.http.close)
            with pinned(plan.cores.client):
                loadgen.run(loadgen.run_closed(_closed(gateway, "warm"), requests=300,
                                               concurrency=plan.slots * 4, max_duration_s=30))
                for rnd in range(1, plan.rounds + 1):
                    rounds.append(run_round(plan, gateway, api, rnd, rnd == plan.rounds, notes,
                                            (redis, backend, gateway)))
            found = scrape(gateway.url, {"gateway_batch_deferred_total",
                                         "gateway_batch_lines_total"})
            notes.append("gateway metrics at the end: " + ", ".join(
                f"`{k}` {v:g}" for k, v in sorted(found.items())))
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"bench batch: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    print(report(plan, rounds, notes), flush=True)
    return code if not any(math.isnan(r.with_p99) for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
