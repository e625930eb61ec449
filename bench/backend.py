"""Backend benchmark: raw in-process ONNX Runtime vs the served backend, side by side.

``python -m bench backend [--requests N] [--concurrency C] [--threads T] [--variant V]
[--device D] [--pin split|none] [--max-seconds S] [--quick]``

1. Raw: the project's own ``load_models`` (the session options and threads ``serve`` uses)
   embeds short texts at batch sizes 1, 8 and 32: tokenize + pad + run, as the server does per
   batch. Rounds are interleaved across batch sizes and split before and after the served run;
   the median round counts, so drift on a shared machine hits both sides alike.
2. Served: ``python -m backend serve`` as a subprocess on a free loopback port, warmed up, then
   ``C`` closed-loop clients each sending one short text per OIP infer request.

Pinning (``--pin split``, the default on 2+ cores): the load generator would compete with the
server for CPU, so the server *and the raw measurement* run on the first usable CPU and the
load generator on the last (``bench.procs.split_cores``); ``--threads`` defaults to the server
side's CPU count, so both sides run the same session on the same CPU. ``--pin none``: nothing
pinned, every CPU for everything, threads = every CPU (the generator's CPU then counts against
the served figure). Exit code 1 when a served request failed or the server would not start;
missed targets are reported, not failed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from backend.model import EmbeddingModel, load_models
from backend.repository import RepositoryError
from backend.runtime import DeviceUnavailable
from backend.settings import Device, ServeSettings, Variant
from bench import loadgen
from bench.loadgen import LoadResult, Reply, Request
from bench.procs import Cores, Service, free_port, pinned, split_cores

SHORT_TEXTS = (  # 8-16 tokens each, [CLS] and [SEP] included
    "How do I reset my password?",
    "The weather in Lisbon is sunny today.",
    "Best laptop for students under 800 dollars",
    "Where is my order? It has not arrived yet.",
    "Cancel my subscription at the end of the month.",
    "A quick brown fox jumps over the lazy dog.",
    "What time does the pharmacy close on Sundays?",
    "Refund policy for damaged items",
    "Cheap flights from Berlin to Rome in May",
    "The meeting has been moved to Thursday afternoon.",
    "How many calories are in a banana?",
    "Please update the shipping address on my account.",
    "Python error: list index out of range",
    "Vegetarian restaurants near the train station",
    "My package was delivered to the wrong house, what should I do?",
    "Our quarterly revenue grew by twelve percent compared to last year.",
)
BATCH_SIZES = (1, 8, 32)
MODEL = "minilm"
TARGET_BEST, TARGET_SINGLE = 0.9, 2.0


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    models: Path
    requests: int
    concurrency: int
    threads: int
    variant: Variant | None
    device: Device
    cores: Cores  # server and raw measurement on .server, load generator on .client
    rounds: int  # raw rounds per batch size, half before and half after the served run
    round_s: float
    warmup_requests: int
    max_seconds: float


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench backend",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--requests", type=int, default=3000, help="served requests (3000)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients (32)")
    parser.add_argument("--threads", type=int, help="ORT threads (default: model-side cores)")
    parser.add_argument("--variant", choices=["fp32", "int8", "fp16"])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--pin", choices=["split", "none"], help="default: split on 2+ cores")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="served-run time cap")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or (args.threads or 1) < 1:
        parser.error("--requests, --concurrency and --threads must be >= 1")
    cores = split_cores()
    if args.pin == "split" and not cores.pinned:
        parser.error("--pin split needs at least 2 usable cores")
    if args.pin == "none":
        every = frozenset(os.sched_getaffinity(0))
        cores = Cores(every, every)
    return Plan(
        models=args.models,
        requests=min(args.requests, 300) if args.quick else args.requests,
        concurrency=args.concurrency,
        threads=args.threads or len(cores.server),
        variant=args.variant,
        device=args.device,
        cores=cores,
        rounds=2 if args.quick else 6,
        round_s=0.3 if args.quick else 2.0,
        warmup_requests=64 if args.quick else 300,
        max_seconds=min(args.max_seconds, 30.0) if args.quick else args.max_seconds,
    )


def pinned_to(cores: frozenset[int], plan: Plan) -> contextlib.AbstractContextManager[None]:
    """Runs the block (and the threads it starts) on ``cores`` when the plan pins."""
    return pinned(cores) if plan.cores.pinned else contextlib.nullcontext()


@dataclass(frozen=True)
class RawRound:
    """One timed round at one batch size."""

    texts_per_s: float
    texts_per_cpu_s: float  # per CPU second used: not skewed by others taking the CPU away
    call_ms: list[float]  # each tokenize + pad + run call


def load_model(plan: Plan) -> EmbeddingModel:
    """The model exactly as ``serve`` loads it, warmed up on short texts."""
    # from_env, as serve does: BACKEND_* variables reach both sides alike.
    settings = ServeSettings.from_env(models_dir=plan.models, threads=plan.threads,
                                      device=plan.device, variant=plan.variant)
    # The report names the provider; the runtime's GPU-fallback warning would only repeat it.
    logging.getLogger("backend").setLevel(logging.ERROR)
    model = next(m for m in load_models(settings) if m.name == MODEL)
    model.warm_up((8, 16), BATCH_SIZES)
    for batch in BATCH_SIZES:
        for _ in range(5):
            model.embed(batch_of(batch, 0))
    return model


def batch_of(size: int, offset: int) -> list[str]:
    """``size`` short texts, cycling the list from ``offset``."""
    return [SHORT_TEXTS[(offset + i) % len(SHORT_TEXTS)] for i in range(size)]


def measure_raw(model: EmbeddingModel, plan: Plan, rounds: int,
                into: dict[int, list[RawRound]]) -> None:
    """``rounds`` rounds of every batch size, interleaved, appended to ``into``."""
    for _ in range(rounds):
        for batch in BATCH_SIZES:
            calls: list[float] = []
            offset = 0
            cpu = time.process_time()
            started = time.perf_counter()
            while time.perf_counter() - started < plan.round_s or len(calls) < 3:
                texts = batch_of(batch, offset)
                offset += batch
                t0 = time.perf_counter()
                model.embed(texts)
                calls.append((time.perf_counter() - t0) * 1000)
            elapsed = time.perf_counter() - started
            count, cpu = len(calls) * batch, time.process_time() - cpu
            into.setdefault(batch, []).append(
                RawRound(count / elapsed, count / cpu if cpu > 0 else math.nan, calls))


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    raw: dict[int, list[RawRound]] = {}
    before = (plan.rounds + 1) // 2
    with pinned_to(plan.cores.server, plan):
        try:
            model = load_model(plan)
        except (RepositoryError, DeviceUnavailable) as exc:
            print(f"bench backend: cannot load the model: {exc}", file=sys.stderr)
            return 2
        provider = model.runtime.provider
        variant = model.runtime.variant
        measure_raw(model, plan, before, raw)
    served = run_served(plan)
    with pinned_to(plan.cores.server, plan):
        measure_raw(model, plan, plan.rounds - before, raw)
    print(report(plan, raw, served, provider, variant), flush=True)
    if served.error:
        print(f"\nserved run failed: {served.error}", file=sys.stderr)
    failed = served.result is None or len(served.result.ok) != len(served.result.samples)
    return 1 if served.error or failed else 0


def plan_args(plan: Plan) -> list[str]:
    """``serve`` flags that make the server's session match the raw one."""
    args = ["--models", str(plan.models), "--threads", str(plan.threads), "--device", plan.device,
            "--grpc-port", "0"]  # REST is what this measures
    return args + (["--variant", plan.variant] if plan.variant else [])


def report(plan: Plan, raw: dict[int, list[RawRound]], served: ServedRun, provider: str,
           variant: str) -> str:
    """The Markdown report: method, figures, targets, where the served time went."""
    method = (f"{plan.cores.describe()}; the raw measurement on the server's CPUs; "
              f"{plan.threads} ONNX Runtime intra-op thread(s) on both sides")
    lines = [
        f"Machine: {_cpu_name()}, {os.cpu_count()} logical CPUs.",
        "",
        f"Method: {method}. Model {MODEL} {variant} on {provider}; "
        f"{len(SHORT_TEXTS)} short texts (8-16 tokens). Raw: median of {plan.rounds} rounds "
        f"of {plan.round_s:g} s per batch size (half before, half after the served run). "
        f"Served: {plan.concurrency} closed-loop clients, 1 text per OIP infer request, "
        f"{plan.requests} requests (cap {plan.max_seconds:g} s) after "
        f"{plan.warmup_requests} warm-up requests.",
        "",
        "| measurement | texts/s | texts per CPU-s | p50 ms | p95 ms | p99 ms | mean batch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    best = single = best_cpu = 0.0
    for batch in BATCH_SIZES:
        rounds = raw.get(batch, [])
        rate = statistics.median(r.texts_per_s for r in rounds) if rounds else 0.0
        per_cpu = statistics.median(r.texts_per_cpu_s for r in rounds) if rounds else 0.0
        calls = [ms for r in rounds for ms in r.call_ms]
        best, best_cpu = max(best, rate), max(best_cpu, per_cpu)
        single = rate if batch == 1 else single
        lines.append(f"| raw in-process, batch {batch} (latency per call) | {rate:.0f} | "
                     f"{per_cpu:.0f} | {_pct(calls, 50)} | {_pct(calls, 95)} | "
                     f"{_pct(calls, 99)} | {batch} |")
    result = served.result
    rate = result.throughput if result is not None else 0.0
    served_cpu = served.texts_per_cpu_s()
    if result is not None:
        lines.append(
            f"| served, {plan.concurrency} clients x 1 text | {rate:.0f} | {served_cpu:.0f} | "
            f"{result.latency_ms(50):.1f} | {result.latency_ms(95):.1f} | "
            f"{result.latency_ms(99):.1f} | {result.info_mean('batch_size'):.1f} |"
        )
    lines += [
        "",
        "| target | ratio | met |",
        "| --- | ---: | :---: |",
        _target(f"served >= {TARGET_BEST}x raw best batch", rate, best, TARGET_BEST),
        _target(f"served >= {TARGET_SINGLE:g}x raw batch 1", rate, single, TARGET_SINGLE),
        "",
        f"- Per CPU second used (not a target; not skewed by other processes taking the CPU "
        f"away, as wall-clock figures are on a shared machine): served "
        f"{_ratio(served_cpu, best_cpu):.2f}x the raw best batch.",
        *served.notes(),
    ]
    return "\n".join(lines)


def _pct(values: list[float], q: float) -> str:
    return f"{loadgen.percentile(values, q):.1f}" if values else "-"


def _ratio(served: float, raw: float) -> float:
    return served / raw if raw > 0 and not math.isnan(served) else 0.0


def _target(name: str, served: float, raw: float, goal: float) -> str:
    ratio = _ratio(served, raw)
    return f"| {name} | {ratio:.2f} | {'yes' if ratio >= goal else 'NO'} |"


@dataclass
class ServedRun:
    """The served measurement and what the server and the generator spent on it."""

    result: LoadResult | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # /metrics deltas over the run
    loop_cpu_s: float = math.nan  # the server's main thread: HTTP, JSON, batching
    worker_cpu_s: float = math.nan  # its other threads: tokenizing, padding, ONNX Runtime
    client_cpu_s: float = math.nan
    model_cores: int = 1
    client_cores: int = 1

    def texts_per_cpu_s(self) -> float:
        """Texts answered per CPU second of the server process (every thread)."""
        cpu = self.loop_cpu_s + self.worker_cpu_s
        ok = len(self.result.ok) if self.result is not None else 0
        return ok / cpu if cpu > 0 else math.nan

    def notes(self) -> list[str]:
        """Where the served time went, one Markdown bullet per finding."""
        result = self.result
        if result is None:
            return [f"- served run failed: {self.error}"]
        wall, m, n = result.wall_s, self.metrics, max(1, len(result.samples))
        calls = m.get("backend_batch_size_count", 0.0)
        per_call = m.get("backend_batch_size_sum", 0.0) / calls if calls else math.nan
        compute = m.get("backend_compute_seconds_sum", math.nan)
        return [
            f"- Served run: {len(result.samples)} requests in {wall:.1f} s (ended by "
            f"{result.stopped_by}); statuses {result.status_counts()}.",
            f"- Batches: {per_call:.1f} texts per ONNX Runtime call on average ({calls:.0f} "
            f"calls, from /metrics); {result.info_mean('batch_size'):.1f} per request "
            "(response parameters: each request reports the batch it rode in).",
            f"- Per request (response parameters): queue {result.info_mean('queue_time_ms'):.1f}"
            f" ms, compute {result.info_mean('compute_time_ms'):.1f} ms; client-observed mean "
            f"{_mean([s.latency_s * 1000 for s in result.ok]):.1f} ms.",
            f"- ONNX Runtime busy {compute / wall:.0%} of the wall time. Server CPU "
            f"{(self.loop_cpu_s + self.worker_cpu_s) / wall:.2f} of {self.model_cores} "
            f"core(s); load generator {self.client_cpu_s / wall:.2f} of {self.client_cores}.",
            f"- Server CPU per request: event loop (HTTP, JSON, batching) "
            f"{self.loop_cpu_s / n * 1e6:.0f} us, worker threads (tokenize, pad, ONNX Runtime) "
            f"{self.worker_cpu_s / n * 1e6:.0f} us.",
        ]


def run_served(plan: Plan) -> ServedRun:
    """Starts the server on its cores, loads it from the generator's, stops it by PID."""
    run = ServedRun(model_cores=len(plan.cores.server), client_cores=len(plan.cores.client))
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "backend", "serve", "--host", "127.0.0.1", "--port",
            str(port), *plan_args(plan)]
    server = Service("backend", argv, cores=plan.cores.server if plan.cores.pinned else None)
    try:
        with server, pinned_to(plan.cores.client, plan):
            server.wait_http(base_url + "/v2/health/ready", timeout_s=180)
            loadgen.run(_load(server, base_url, plan, run))
    except (RuntimeError, aiohttp.ClientError, OSError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def thread_cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) ``pid`` has used: its main thread (the event loop), and
    every other thread (batch worker, ONNX Runtime and tokenizer pools) together."""
    tick = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread may end while we look
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
            if task.name == str(pid):
                main += seconds
            else:
                others += seconds
    return main, others


async def _load(server: Service, base_url: str, plan: Plan, run: ServedRun) -> None:
    url = f"{base_url}/v2/models/{MODEL}/infer"
    headers = {"Content-Type": "application/json"}
    bodies = [orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                        "data": [text]}]}) for text in SHORT_TEXTS]

    def make(index: int) -> Request:
        return Request(url=url, body=bodies[index % len(bodies)], headers=headers)

    async with loadgen.client_session(pool=plan.concurrency) as http:
        await loadgen.run_closed(make, requests=plan.warmup_requests,
                                 concurrency=plan.concurrency, max_duration_s=60, session=http)
        before = await _metrics(http, base_url)
        (loop0, work0), own0 = thread_cpu_seconds(server.pid), time.process_time()
        run.result = await loadgen.run_closed(
            make, requests=plan.requests, concurrency=plan.concurrency,
            max_duration_s=plan.max_seconds, inspect=read_parameters, session=http,
        )
        loop1, work1 = thread_cpu_seconds(server.pid)
        run.loop_cpu_s, run.worker_cpu_s = loop1 - loop0, work1 - work0
        run.client_cpu_s = time.process_time() - own0
        after = await _metrics(http, base_url)
    run.metrics = {name: value - before.get(name, 0.0) for name, value in after.items()}


def read_parameters(reply: Reply) -> Mapping[str, float]:
    """The OIP response's numeric ``parameters`` (batch size, queue and compute ms).

    Cuts the small ``parameters`` object out instead of parsing 384 floats: the generator's
    CPU is what the server would otherwise get on a small machine.
    """
    key = b'"parameters":'
    start = reply.body.find(key) if reply.status == 200 else -1
    end = reply.body.find(b"}", start) if start >= 0 else -1
    if end < 0:
        return {}
    params = orjson.loads(reply.body[start + len(key) : end + 1])
    return {k: float(v) for k, v in params.items() if isinstance(v, int | float)}


async def _metrics(http: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """Summed ``_sum``/``_count`` samples of the batch-size and compute histograms."""
    async with http.get(base_url + "/metrics") as response:
        text = await response.text()
    wanted = ("backend_batch_size", "backend_compute_seconds")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan
