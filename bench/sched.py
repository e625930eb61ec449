"""Scheduling benchmark (issue 23) with the real model: noisy neighbour, a Batch API batch beside
interactive calls, overload at 3x C, a burst of deadlines.

``python -m bench sched [--rounds R] [--duration S] [--c-clients 8,16,64] [--flood-clients 64]
[--lines 10000] [--flood X] [--burst N] [--no-extra] [--quick]``

Set-up: one backend (real MiniLM, one inference thread) and one gateway (shipped defaults, a
tenants file with ``a``, ``b`` and ``bulk`` of class batch, and ``batch.redis_url`` pointing at
a private ``redis-server`` this bench starts on a free port, never 127.0.0.1:6379) pinned
together to the first CPU; the load generator, A's flood process and that Redis on the last.
Every request a true miss (a unique text, ``no-store``). Short texts are one sentence (~12
tokens), long ones ~300 words (cut to 256 tokens). Open-loop phases use ``bench/openloop.py``
(latency from the scheduled send time); in every phase where B's p99 is measured (its
baselines too) the generator runs at real-time priority where allowed, so A's flood process on
the same CPU does not delay B's sends (the overload phases run as before, at normal priority).

Warm-up: a closed loop, then one at each of ``--c-clients`` (8, 16, 64 connections): C's
connection count is the one with the most 2xx answers per second. (At 64 the gateway's wait
bound sheds interactive requests at once, and those fast 503s would count against C.) Per
round:

1. C: closed-loop capacity for short texts through the gateway, in 2xx answers per second
   (tenant a, the connection count found in the warm-up). Then the same closed loop with
   tenants a and b in turn, request by request ("evenly busy"): (A + B) 2xx/s over C, the
   capacity an express set-up (``BACKEND_EXPRESS_LANE``, ``admission.express``) must not
   cost two busy tenants; an extra row, not one of the issue's targets.
2. Noisy neighbour, as the issue sets it: B alone at 0.3 C (open loop), then A as a closed
   loop on ``--flood-clients`` (64) connections in a process of its own
   (``bench/sched_flood.py``: every answer, 503 included, followed at once by the next
   request) with B at 0.3 C: B's goodput, B's p99 / B's p99 alone, (A + B 2xx/s) / C, A
   counted over B's window (A starts a second before B and stops a few seconds after).
   Extra row (unless ``--no-extra``): A as an open loop at ``--flood`` (3) x C with B at 0.3 C
   in one stream, the earlier variant.
3. Batch beside interactive, as the issue sets it: B alone at 0.6 C, then a real Batch API
   batch of ``--lines`` (10,000) one-text lines (short, unique texts; ``/v1/files`` then
   ``/v1/batches``, tenant ``bulk``) is submitted, and once its first lines complete B runs at
   0.6 C for the phase; the batch's completed lines are read before and after B's phase, then
   the batch is cancelled (and the bench waits until it is; a batch that ran out of lines
   first shows "completed", and its rate is then a floor). B's p99 / alone, B's goodput, the
   batch's completed lines/s over the spare (C - 0.6 C), and why the gateway's batch gate held
   lines back meanwhile (``gateway_batch_deferred_total`` by reason). Extra row: B at 0.6 C
   with ``bulk`` (class batch) as an open loop at 1.0 C, the earlier variant.
4. Overload: A alone at 0.7 C, then at 3 C (open loop): goodput (2xx/s over C), admitted p99
   / p99 at 0.7 C.
5. Deadlines: C_long (closed loop, long texts, 16 connections as the issue has it), then ``N``
   (300) long texts at once with ``X-Request-Timeout-Ms: 600``: served vs 0.9 x C_long x 0.6 s,
   none late, texts the backend computed during the burst vs those served, p50 of the
   non-served answers.

Every phase shows the CPU the gateway and backend used and what other processes took (a loaded
machine's figures do not decide; the flood process, Redis and this generator are not "other").
Reported, never a failure; exit code 1 when a server would not start or a request got no answer
at all. ("No loss vs raw ONNX Runtime": ``bench backend``.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import math
import re
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import loadgen, openloop, services
from bench.batch_api import BatchClient
from bench.loadgen import LoadResult, Request, Sample
from bench.overload import scrape
from bench.procs import Cores, Service, busy_seconds, pinned, split_cores, steal_seconds
from bench.sched_report import (
    BATCH,
    BULK_OPEN,
    EVEN,
    LOAD_07,
    NOISY,
    NOISY_OPEN,
    OVERLOAD,
    QUIET_03,
    QUIET_06,
    BatchRun,
    Burst,
    Calibration,
    CoreSplit,
    Round,
    Setup,
    report,
)
from bench.services import Server
from bench.tenants import Phase, mixed_schedule

__all__ = ["Burst", "main"]

ROUTE = "/v1/embeddings"
KEYS = {"a": "bench-sched-a-key-0000000000001", "b": "bench-sched-b-key-0000000000001",
        "bulk": "bench-sched-bulk-key-00000000001"}
WORDS = "the quick brown fox jumps over the lazy dog near the river bank "
FLOOD_LEAD_S = 1.0  # A floods this long before B starts
FLOOD_TAIL_S = 3.0  # and this long after B's schedule ends (B's last answers still come)
A_INDEX = 1 << 40  # A's samples in a merged phase: index A_INDEX + i (B's: 0, 1, ...)
MAX_LINES = 50_000  # batch.max_lines as shipped
BURST_SPREAD_S = 0.01  # the deadline burst's requests are all due within this


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    rounds: int
    duration_s: float
    flood: float
    burst: int
    cores: Cores
    models: Path
    c_clients: tuple[int, ...] = (8, 16, 64)
    flood_clients: int = 64
    lines: int = 10_000
    extra: bool = True
    settings: tuple[tuple[str, str], ...] = ()
    """Gateway settings over the shipped defaults (``--set KEY=VALUE``; none for the issue's
    figures)."""

    def setup(self) -> Setup:
        return Setup(self.cores, self.rounds, self.duration_s, self.flood, self.flood_clients,
                     self.lines, self.settings)


def parse(argv: Sequence[str]) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench sched",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (8)")
    parser.add_argument("--c-clients", default="8,16,64",
                        help="connection counts tried for C in the warm-up (8,16,64)")
    parser.add_argument("--flood-clients", type=int, default=64,
                        help="A's closed-loop connections in the noisy phase (64)")
    parser.add_argument("--lines", type=int, default=10_000,
                        help=f"lines of the Batch API batch (10000, at most {MAX_LINES})")
    parser.add_argument("--flood", type=float, default=3.0,
                        help="A's load / C in the extra open-loop noisy phase (3)")
    parser.add_argument("--burst", type=int, default=300, help="long texts at once (300)")
    parser.add_argument("--no-extra", action="store_true",
                        help="skip the extra open-loop variants (A at --flood x C, bulk at 1 C; "
                             "the evenly busy phase still runs)")
    parser.add_argument("--models", default="models", help="model repository (models)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s phases")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a gateway setting over the shipped defaults, e.g. "
                             "admission.max_wait_factor=2 (repeatable; the report names them)")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set: KEY=VALUE")
    try:
        c_clients = tuple(sorted({int(n) for n in args.c_clients.split(",") if n.strip()}))
    except ValueError:
        parser.error("--c-clients: comma-separated connection counts")
    if (min(args.rounds, args.duration, args.flood, args.burst, args.flood_clients,
            args.lines, *c_clients, 1) <= 0 or not c_clients):
        parser.error("every number must be > 0")
    if args.lines > MAX_LINES:
        parser.error(f"--lines: at most {MAX_LINES} (batch.max_lines as shipped)")
    return Plan(rounds=1 if args.quick else args.rounds,
                duration_s=min(args.duration, 2.0) if args.quick else args.duration,
                flood=args.flood, burst=args.burst, cores=split_cores(),
                models=Path(args.models), c_clients=c_clients,
                flood_clients=args.flood_clients, lines=args.lines, extra=not args.no_extra,
                settings=tuple((k, v) for k, v in (item.split("=", 1) for item in args.set)))


def short_text(tag: str, index: int) -> str:
    """One sentence (~12 tokens), unique to ``tag`` and ``index``."""
    return f"sched {tag} {index}: how do I reset my password today?"


def short(tag: str, index: int) -> bytes:
    return orjson.dumps({"model": "minilm", "input": short_text(tag, index)})


def long(tag: str, index: int) -> bytes:
    return orjson.dumps({"model": "minilm", "input": f"sched {tag} {index} " + WORDS * 26})


def headers(tenant: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "Cache-Control": "no-store", **extra}


def batch_file(lines: int, tag: str) -> bytes:
    """The Batch API input: ``lines`` embeddings requests of one short text each, unique."""
    return b"".join(orjson.dumps({
        "custom_id": f"{tag}-{i}", "method": "POST", "url": ROUTE,
        "body": {"model": "minilm", "input": short_text(tag, i)}}) + b"\n"
        for i in range(lines))


def flood_in_window(rows: Sequence[Sequence[float]], stamp: float, start: float,
                    end: float) -> list[Sample]:
    """A's answers (``[index, sent_s, latency_s, status]`` from ``bench.sched_flood``, ``sent_s``
    counted from ``stamp``) that came back between ``start`` and ``end`` (perf_counter), as
    samples indexed from ``A_INDEX``."""
    return [Sample(index=A_INDEX + int(i), sent_s=sent, latency_s=lat, lag_s=0.0,
                   status=int(status))
            for i, sent, lat, status in rows if start <= stamp + sent + lat <= end]


def even(index: int) -> str:
    """The evenly busy phase's tenant of request ``index``: a and b in turn."""
    return "ab"[index % 2]


def merged_tenant(index: int) -> str:
    """Tenant of a sample in a merged phase: A's from ``A_INDEX`` up, B's below."""
    return "a" if index >= A_INDEX else "b"


class Runner:
    """Runs the phases against one gateway and backend, measuring CPU around each."""

    def __init__(self, plan: Plan, gateway: Server, backend: Server, redis: Server,
                 api: BatchClient, work: Path) -> None:
        self.plan, self.gateway, self.backend, self.redis = plan, gateway, backend, redis
        self.api, self.work = api, work
        self.url = f"{gateway.url}{ROUTE}"
        self.splits: dict[str, CoreSplit] = {}  # the current round's, by phase name

    def closed(self, tag: str, body: Callable[[str, int], bytes], clients: int,
               tenant_of: Callable[[int], str] = lambda i: "a") -> LoadResult:
        """A closed loop on ``clients`` connections for the phase's duration; request ``i``
        sent as ``tenant_of(i)`` (tenant a by default)."""
        json_h = {t: {"Content-Type": "application/json", **headers(t)} for t in KEYS}
        return loadgen.run(loadgen.run_closed(
            lambda i: Request(url=self.url, body=body(tag, i), headers=json_h[tenant_of(i)]),
            requests=100_000, concurrency=clients, max_duration_s=self.plan.duration_s))

    def calibrate(self) -> Calibration:
        """The warm-up: a closed loop, then one per connection count tried for C."""
        self.closed("warm", short, max(self.plan.c_clients))
        found = Calibration()
        for n in self.plan.c_clients:
            found.tried[n] = self.closed(f"cal{n}", short, n)
        return found

    def _ours(self) -> float:
        return self.gateway.service.cpu_seconds() + self.backend.service.cpu_seconds()

    def _helpers(self, extra: Service | None) -> float:
        """CPU of the processes that are the test's but not the servers measured."""
        return self.redis.service.cpu_seconds() + (extra.cpu_seconds() if extra else 0.0)

    def _open_loop(self, tag: str, rate: float, tenant_of: Callable[[int], str],
                   realtime: bool) -> openloop.Result:
        gateway = self.gateway

        def make(i: int) -> bytes:
            return openloop.request_bytes(gateway.host, gateway.port, ROUTE, short(tag, i),
                                          headers(tenant_of(i)))
        return openloop.run(gateway.host, gateway.port, make, rate_per_s=rate,
                            requests=int(rate * self.plan.duration_s),
                            max_duration_s=self.plan.duration_s, max_connections=1024,
                            timeout_s=10.0, realtime=realtime)

    def _split_start(self) -> CoreSplit:
        """Before a phase, the counters as they stand (the clock in ``wall_s``): the backend's
        batch counts scraped first, so the scrape's own CPU is outside the phase."""
        texts, batches = _batches(self.backend)
        return CoreSplit(time.perf_counter(), self.gateway.service.cpu_seconds(),
                         self.backend.service.cpu_seconds(), 0, texts, batches)

    def _split_end(self, start: CoreSplit, result: LoadResult) -> CoreSplit:
        """After it: the CPU read before the scrape, each counter less ``start``'s."""
        gateway_s = self.gateway.service.cpu_seconds() - start.gateway_s
        backend_s = self.backend.service.cpu_seconds() - start.backend_s
        wall = time.perf_counter() - start.wall_s
        texts, batches = _batches(self.backend)
        return CoreSplit(wall, gateway_s, backend_s, len(result.ok), texts - start.texts,
                         batches - start.batches)

    def measured_c(self, rnd: int, clients: int) -> tuple[float, CoreSplit]:
        """C of a round (its closed loop) and the core's split over it."""
        start = self._split_start()
        result = self.closed(f"c{rnd}", short, clients)
        return result.throughput, self._split_end(start, result)

    def opened(self, name: str, rnd: int, tag: str, rate: float,
               tenant_of: Callable[[int], str], *, realtime: bool = False,
               flood: Service | None = None,
               merge: Callable[[openloop.Result, float], LoadResult] | None = None) -> Phase:
        """An open-loop phase; ``flood``: a process whose CPU is the test's, not "other";
        ``merge``: adds samples to B's (A's closed loop), given the perf_counter at start."""
        return self._measured(name, rnd, rate, tenant_of,
                              lambda: self._open_loop(tag, rate, tenant_of, realtime),
                              flood=flood, merge=merge)

    def evenly(self, rnd: int, clients: int) -> Phase:
        """Tenants a and b evenly busy: C's closed loop (``clients`` connections) with the
        requests alternating between them. What an express set-up must not cost: the two
        are served as one tenant would be (``offered`` nan: a closed loop)."""
        return self._measured(f"A and B evenly busy (closed loop, {clients} conn, "
                              "alternating)", rnd, math.nan, even,
                              lambda: self.closed(f"e{rnd}", short, clients, even))

    def _measured(self, name: str, rnd: int, offered: float, tenant_of: Callable[[int], str],
                  run: Callable[[], Any], *, flood: Service | None = None,
                  merge: Callable[[openloop.Result, float], LoadResult] | None = None
                  ) -> Phase:
        """A phase's load (``run``) with the CPU read around it (see ``opened``)."""
        split0 = self._split_start()
        steal0, busy0, own0 = steal_seconds(), busy_seconds(), time.process_time()
        ours0, helpers0 = self._ours(), self._helpers(flood)
        start = time.perf_counter()
        loaded = run()
        wall = max(loaded.wall_s, 1e-9)
        ours = self._ours() - ours0
        split = self._split_end(split0, loaded)
        other = (busy_seconds() - busy0 - ours - (self._helpers(flood) - helpers0)
                 - (time.process_time() - own0))
        result = merge(loaded, start) if merge is not None else loaded
        # A's answers in B's window count too (the CPU was read over that window).
        self.splits[name] = dataclasses.replace(split, answers=len(result.ok))
        return Phase(name, rnd, offered, result, tenant_of, (steal_seconds() - steal0) / wall,
                     ours / wall, max(0.0, other) / wall)

    def flooded(self, name: str, rnd: int, tag: str, rate: float) -> Phase:
        """A as a closed loop on ``flood_clients`` connections (its own process) with B's open
        loop at ``rate``; A's answers counted over B's window."""
        out = self.work / f"flood-{tag}.json"
        total = FLOOD_LEAD_S + self.plan.duration_s + FLOOD_TAIL_S
        argv = [sys.executable, "-m", "bench.sched_flood", "--url", self.url, "--tenant", "a",
                "--tag", f"{tag}a", "--clients", str(self.plan.flood_clients), "--duration",
                f"{total:g}", "--out", str(out)]
        flood = Service("sched-flood", argv, cores=self.plan.cores.client)
        with flood:
            _wait_started(flood, timeout_s=60.0)
            time.sleep(FLOOD_LEAD_S)

            def merge(b: openloop.Result, start: float) -> LoadResult:
                _wait_exit(flood, timeout_s=total + 90.0)
                data = orjson.loads(out.read_bytes())
                a = flood_in_window(data["samples"], float(data["stamp"]), start,
                                    start + b.wall_s)
                return LoadResult("open+closed", [*b.samples, *a], b.wall_s,
                                  b.planned + len(a), b.shed, b.stopped_by)

            # merged_tenant: "b" for every index the open loop sends, "a" for A's samples
            return self.opened(name, rnd, f"{tag}b", rate, merged_tenant, realtime=True,
                               flood=flood, merge=merge)

    def batched(self, name: str, rnd: int, tag: str, rate: float) -> tuple[Phase, BatchRun]:
        """A Batch API batch of ``lines`` (tenant bulk), B at ``rate`` beside it, then cancel."""
        batch_id = self._submit(tag)
        before = self._wait_running(batch_id, timeout_s=60.0)
        deferred0 = _deferred(self.gateway)
        done0, failed0, t0 = (*self._counts(batch_id), time.monotonic())
        phase = self.opened(name, rnd, tag, rate, lambda i: "b", realtime=True)
        done1, failed1, t1 = (*self._counts(batch_id), time.monotonic())
        deferred1 = _deferred(self.gateway)
        cancel = self.api.http.post(f"/batches/{batch_id}/cancel")
        if cancel.status_code != 409:  # 409: it ran out of lines first (finalizing, completed)
            cancel.raise_for_status()
        final = self.api.finish(batch_id, timeout_s=180.0)
        return phase, BatchRun(self.plan.lines, before, done1 - done0, failed1 - failed0,
                               t1 - t0, str(final["status"]),
                               {k: v - deferred0.get(k, 0.0) for k, v in deferred1.items()})

    def _submit(self, tag: str) -> str:
        http = self.api.http
        up = http.post("/files", files={"file": (f"{tag}.jsonl", batch_file(self.plan.lines,
                                                                            tag))},
                       data={"purpose": "batch"})
        up.raise_for_status()
        made = http.post("/batches", json={"input_file_id": up.json()["id"], "endpoint": ROUTE,
                                           "completion_window": "24h"})
        made.raise_for_status()
        return str(made.json()["id"])

    def _counts(self, batch_id: str) -> tuple[int, int]:
        counts = self.api.get(batch_id)["request_counts"]
        if not isinstance(counts, dict):
            raise RuntimeError(f"batch {batch_id}: no request_counts in {counts!r}")
        return int(counts["completed"]), int(counts["failed"])

    def _wait_running(self, batch_id: str, timeout_s: float) -> int:
        """Waits until the batch's first lines complete (it is running); lines done by then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done, failed = self._counts(batch_id)
            if done + failed > 0:
                return done
            time.sleep(0.05)
        raise RuntimeError(f"batch {batch_id}: no line completed in {timeout_s:g} s")

    def burst(self) -> Burst:
        c_long = self.closed("clong", long, 16).throughput
        computed0, _ = _batches(self.backend)
        busy0, own0 = busy_seconds(), time.process_time()
        ours0, helpers0 = self._ours(), self._helpers(None)
        gateway = self.gateway
        burst_h = headers("b", **{"X-Request-Timeout-Ms": "600"})

        def make(i: int) -> bytes:
            return openloop.request_bytes(gateway.host, gateway.port, ROUTE, long("burst", i),
                                          burst_h)
        # The precise generator (kernel receive stamps), every request due in the first
        # 10 ms: an event-loop client busy with 300 connections read answers 100-250 ms after
        # they came (measured against the gateway's own Server-Timing total), which counted
        # answers on time as late and refusals as slow. Its connections are open before the
        # burst (clients keep pools): 300 connects at once measure the kernel's accept queue
        # (connections.backlog), not scheduling.
        n = self.plan.burst
        result: LoadResult = openloop.run(
            gateway.host, gateway.port, make, rate_per_s=n / BURST_SPREAD_S, requests=n,
            max_duration_s=BURST_SPREAD_S + 1.0, max_connections=n + 16, timeout_s=10.0,
            warm_connections=n)
        wall = max(result.wall_s, 1e-9)
        time.sleep(0.5)  # let batches already running finish before counting
        ours = self._ours() - ours0
        other = (busy_seconds() - busy0 - ours - (self._helpers(None) - helpers0)
                 - (time.process_time() - own0))
        return Burst(c_long, result, _batches(self.backend)[0] - computed0,
                     max(0.0, other) / wall)

    def one_round(self, rnd: int, clients: int) -> Round:
        self.splits = {}
        c, self.splits["C: closed loop"] = self.measured_c(rnd, clients)
        r = Round(rnd, c, cores=self.splits)
        ph = r.phases
        ph[EVEN] = self.evenly(rnd, clients)
        ph[QUIET_03] = self.opened("B alone at 0.3x C", rnd, f"q{rnd}", 0.3 * c,
                                   lambda i: "b", realtime=True)
        ph[NOISY] = self.flooded(f"A closed loop ({self.plan.flood_clients} conn) + B at "
                                 "0.3x C", rnd, f"n{rnd}", 0.3 * c)
        if self.plan.extra:
            flood = self.plan.flood
            ph[NOISY_OPEN] = self.opened(f"extra: A open loop at {flood:g}x C + B at 0.3x C",
                                         rnd, f"m{rnd}", (flood + 0.3) * c,
                                         mixed_schedule(flood, 0.3), realtime=True)
        ph[QUIET_06] = self.opened("B alone at 0.6x C", rnd, f"i{rnd}", 0.6 * c,
                                   lambda i: "b", realtime=True)
        ph[BATCH], r.batch = self.batched(f"B at 0.6x C + Batch API batch ({self.plan.lines} "
                                          "lines, bulk)", rnd, f"x{rnd}", 0.6 * c)
        if self.plan.extra:
            ph[BULK_OPEN] = self.opened("extra: B at 0.6x C + bulk open loop at 1.0x C", rnd,
                                        f"y{rnd}", 1.6 * c,
                                        _named(mixed_schedule(1.0, 0.6), "bulk"),
                                        realtime=True)
        ph[LOAD_07] = self.opened("A alone at 0.7x C", rnd, f"s{rnd}", 0.7 * c, lambda i: "a")
        ph[OVERLOAD] = self.opened("A alone at 3x C", rnd, f"o{rnd}", 3.0 * c, lambda i: "a")
        r.burst = self.burst()
        return r


def _wait_started(flood: Service, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "started" in flood.log_tail():
            return
        if not flood.alive():
            raise RuntimeError(f"the flood process exited early:\n{flood.log_tail()}")
        time.sleep(0.01)
    raise RuntimeError(f"the flood process did not start in {timeout_s:g} s")


def _wait_exit(flood: Service, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while flood.alive():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the flood process did not end in {timeout_s:g} s")
        time.sleep(0.05)
    if flood.proc is not None and flood.proc.returncode != 0:
        raise RuntimeError(f"the flood process failed:\n{flood.log_tail()}")


def _named(schedule: Callable[[int], str], flood_name: str) -> Callable[[int], str]:
    """``mixed_schedule`` with its flooding tenant renamed."""
    return lambda i: flood_name if schedule(i) == "a" else "b"


def deferred_by_reason(scraped: dict[str, float]) -> dict[str, float]:
    """``gateway_batch_deferred_total{reason="busy"}`` -> ``{"busy": ...}``."""
    found: dict[str, float] = {}
    for key, value in scraped.items():
        match = re.search(r'reason="([^"]*)"', key)
        if match:
            found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found


def _deferred(gateway: Server) -> dict[str, float]:
    return deferred_by_reason(scrape(gateway.url, {"gateway_batch_deferred_total"}))


def _batches(backend: Server) -> tuple[float, float]:
    """Texts and batches the backend has computed (every model and worker together)."""
    found = scrape(backend.url, {"backend_batch_size_sum", "backend_batch_size_count"})
    return (sum(v for k, v in found.items() if k.startswith("backend_batch_size_sum")),
            sum(v for k, v in found.items() if k.startswith("backend_batch_size_count")))


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


def gateway_settings(work: Path, redis_url: str) -> dict[str, object]:
    """Shipped defaults but for the tenants file and the Redis of the Batch API (batch only:
    the cache and quotas stay as they are without a Redis)."""
    return {"tenants_file": str(tenants_file(work)), "batch.redis_url": redis_url}


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    calibration = Calibration()
    rounds: list[Round] = []
    code = 0
    try:
        with contextlib.ExitStack() as stack:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sched-")))
            redis = stack.enter_context(services.redis(cores=plan.cores.client))
            backend = stack.enter_context(services.backend(plan.models, cores=plan.cores.server))
            gateway = stack.enter_context(services.gateway(
                backend.url, cores=plan.cores.server,
                settings={**gateway_settings(work, services.redis_url(redis)),
                          **dict(plan.settings)}))
            api = BatchClient(gateway)
            stack.callback(api.http.close)
            api.http.headers["Authorization"] = f"Bearer {KEYS['bulk']}"
            runner = Runner(plan, gateway, backend, redis, api, work)
            with pinned(plan.cores.client):
                calibration = runner.calibrate()
                for rnd in range(1, plan.rounds + 1):
                    rounds.append(runner.one_round(rnd, calibration.best))
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"bench sched: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    print(report(plan.setup(), calibration, rounds, started), flush=True)
    lost = any(s.status == 0 for r in rounds for p in r.phases.values()
               for s in p.result.samples)
    if lost or not rounds or math.isnan(rounds[0].c):
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
