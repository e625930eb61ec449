"""Resilience benchmark (issue 15): a near-zone kill under steady load, with and without the
retry policy.

``python -m bench resilience [--rate 40] [--duration 12] [--kill-at 4] [--rounds 3] [--quick]``

The near zone is a real model server (``python -m backend serve``, the real MiniLM on the CPU)
behind a proxy process (``bench.fault_proxy``: 502 when the server is gone, as a Kubernetes
Service, a sidecar or an ingress answers); the far zone is a second real model server. A gateway
process (one worker, default settings but for the retry policy under test) sits in zone-a. An
open-loop generator (``bench.openloop``: sends on schedule, latency from the scheduled time)
offers ``rate`` misses per second (unique texts, ``Cache-Control: no-store``) for ``duration``
seconds; at ``kill_at`` the near model server gets SIGKILL and stays dead.

Variants, each with a fresh gateway and a fresh near model server:

- **no retries**: ``routing.retry: false``.
- **before issue 15**: what the gateway retried until then: connection failures and a 503, once
  (``retry_on: [connect-failure, reset, retriable-status-codes]``,
  ``retriable_status_codes: [503]``).
- **retry policy**: the defaults (``retry_on`` connect-failure, reset, retriable-status-codes;
  500, 502, 503, 504; one retry; the retry budget).

Each round runs every variant once, in turn. Reported per variant: requests and failed (not
200) over all rounds with the statuses, failed per round, and the median over the rounds of p50
and p99 of all answers, and of p99 and the slowest answer in the two seconds after the kill. Exit
code 1 when a server would not start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench import openloop
from bench.fault_proxy import ProxyProc, start_proxy
from bench.gateway_probe import metric_samples
from bench.loadgen import LoadResult, percentile
from bench.procs import Service, clean_env, free_port

REPO = Path(__file__).resolve().parent.parent
WINDOW_S = 2.0  # after the kill, the answers this report looks at closely

VARIANTS: dict[str, Mapping[str, Any]] = {
    "no retries": {"retry": False},
    "before issue 15": {"retry_on": ["connect-failure", "reset", "retriable-status-codes"],
                        "retriable_status_codes": [503]},
    "retry policy (defaults)": {},
}


@dataclass(frozen=True)
class Plan:
    rate: float
    duration_s: float
    kill_at_s: float
    rounds: int
    models: Path


@dataclass(frozen=True)
class Row:
    variant: str
    result: LoadResult
    kill_at_s: float
    counts: Mapping[str, float]  # the gateway's own: retries, refused by the budget, ejections

    def failed(self) -> dict[int, int]:
        return {s: n for s, n in self.result.status_counts().items() if s != 200}

    def latency_ms(self, q: float, *, after_kill: bool = False) -> float:
        samples = self.result.samples
        if after_kill:
            samples = [s for s in samples
                       if self.kill_at_s <= s.sent_s < self.kill_at_s + WINDOW_S]
        return percentile([s.latency_s for s in samples if s.status], q) * 1000.0


def backend(models: Path, name: str) -> tuple[Service, str]:
    """A real model server on a free port, ready (warmed up) on return."""
    port = free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models), "--host",
            "127.0.0.1", "--port", str(port), "--threads", "1", "--device", "cpu",
            "--log-level", "WARNING"]
    service = Service(name, argv, env=clean_env(BACKEND_ACCESS_LOG="false"), cwd=str(REPO))
    service.start()
    url = f"http://127.0.0.1:{port}"
    try:
        service.wait_http(f"{url}/v2/health/ready", timeout_s=240.0)
    except BaseException:
        service.stop()
        raise
    return service, url


@contextlib.contextmanager
def gateway(near: str, far: str, routing: Mapping[str, Any]) -> Iterator[int]:
    """``python -m gateway serve`` (one worker) in zone-a: near in zone-a, far in zone-b."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-resilience-") as workdir:
        config = Path(workdir) / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"url": near, "region": "r1", "zone": "zone-a"},
                         {"url": far, "region": "r1", "zone": "zone-b"}],
            "routing": {"region": "r1", "zone": "zone-a", **routing},
            "cache": {"node": {"path": str(Path(workdir) / "node")}},
            "logging": {"access_log": "off"},
        }), encoding="utf-8")
        argv = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port",
                str(port), "--workers", "1", "--config", str(config)]
        # A node cache of its own: the default directory outlives the run.
        node = Path(tempfile.mkdtemp(prefix="bench-resilience-node-"))
        service = Service("gateway", argv, env=clean_env(GATEWAY_CACHE_NODE_PATH=str(node)),
                          cwd=str(REPO))
        service.start()
        try:
            service.wait_http(f"http://127.0.0.1:{port}/readyz", timeout_s=60.0)
            yield port
        finally:
            service.stop()


def one_variant(plan: Plan, name: str, routing: Mapping[str, Any], far: str) -> Row:
    near, near_url = backend(plan.models, "near-backend")
    proxy: ProxyProc | None = None
    try:
        proxy = start_proxy(near_url, free_port(), cwd=str(REPO))
        with gateway(proxy.url, far, routing) as port:
            run_id = f"{name}-{time.time_ns()}"

            def request(i: int) -> bytes:
                body = orjson.dumps({"model": "minilm", "input": f"{run_id} text {i}"})
                return openloop.request_bytes("127.0.0.1", port, "/v1/embeddings", body,
                                              {"Cache-Control": "no-store"})

            warm = openloop.run("127.0.0.1", port, request, rate_per_s=plan.rate,
                                requests=int(plan.rate), max_duration_s=5.0)
            if warm.status_counts() != {200: len(warm.samples)}:
                raise RuntimeError(f"{name}: warm-up failed: {warm.status_counts()}")
            kill = threading.Timer(plan.kill_at_s, os.kill, (near.pid, signal.SIGKILL))
            kill.start()
            try:
                result = openloop.run(
                    "127.0.0.1", port, lambda i: request(100_000 + i), rate_per_s=plan.rate,
                    requests=int(plan.rate * plan.duration_s), max_duration_s=plan.duration_s)
            finally:
                kill.cancel()
            counts = gateway_counts(f"http://127.0.0.1:{port}")
    finally:
        if proxy is not None:
            proxy.stop()
        near.stop()
    return Row(name, result, plan.kill_at_s, counts)


def gateway_counts(base_url: str) -> dict[str, float]:
    """Retries by reason, retries the budget refused, ejections, from the gateway's /metrics."""
    names = {"gateway_upstream_retries_total": "retries",
             "gateway_upstream_retry_overflow_total": "refused",
             "gateway_backend_ejections_total": "ejections"}
    counts: dict[str, float] = {}
    for sample in metric_samples(base_url, set(names)):
        keys = [names[sample.name]]
        if sample.name == "gateway_upstream_retries_total":
            keys.append("retry " + sample.labels.get("reason", "?"))
        for key in keys:
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def report(plan: Plan, rows: Sequence[Row]) -> str:
    lines = [
        f"Near-zone kill at {plan.kill_at_s:g} s of {plan.duration_s:g} s, {plan.rate:g} "
        f"requests/s open loop (misses, real MiniLM on the CPU, one thread per server), "
        f"{plan.rounds} round(s); latency from the scheduled send time, all answers, median of "
        f"the rounds.",
        "",
        "| variant | requests | failed | failed per round | failed statuses | retries (by reason) "
        "| refused by the budget | p50 ms | p99 ms | "
        f"p99 ms, {WINDOW_S:g} s after the kill | max ms, {WINDOW_S:g} s after the kill |",
        "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant in VARIANTS:
        runs = [row for row in rows if row.variant == variant]
        failed: Counter[int] = Counter()
        for row in runs:
            failed.update(row.failed())
        statuses = ", ".join(f"{n} x {s or 'no answer'}" for s, n in sorted(failed.items()))
        per_round = ", ".join(str(sum(row.failed().values())) for row in runs)
        counts: dict[str, float] = {"retries": 0.0, "refused": 0.0}
        for row in runs:
            for key, value in row.counts.items():
                counts[key] = counts.get(key, 0.0) + value
        reasons = ", ".join(f"{k.removeprefix('retry ')} {v:g}" for k, v in sorted(counts.items())
                            if k.startswith("retry "))
        retried = f"{counts['retries']:g}" + (f" ({reasons})" if reasons else "")

        def median(figure: Callable[[Row], float], runs: list[Row] = runs) -> float:
            return statistics.median(figure(row) for row in runs)

        lines.append(
            f"| {variant} | {sum(len(r.result.samples) for r in runs)} | "
            f"{sum(failed.values())} | {per_round} | {statuses or 'none'} | {retried} | "
            f"{counts['refused']:g} | "
            f"{median(lambda r: r.latency_ms(50)):.1f} | "
            f"{median(lambda r: r.latency_ms(99)):.1f} | "
            f"{median(lambda r: r.latency_ms(99, after_kill=True)):.1f} | "
            f"{median(lambda r: r.latency_ms(100, after_kill=True)):.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench resilience", description=__doc__)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of load")
    parser.add_argument("--kill-at", type=float, default=4.0, help="seconds into the load")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every variant")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--quick", action="store_true", help="one round, 6 s, kill at 2 s")
    args = parser.parse_args(argv)
    plan = Plan(args.rate, 6.0 if args.quick else args.duration,
                2.0 if args.quick else args.kill_at, 1 if args.quick else max(1, args.rounds),
                args.models)
    if not 0 < plan.kill_at_s < plan.duration_s:
        parser.error("--kill-at must fall inside --duration")
    try:
        far, far_url = backend(plan.models, "far-backend")
    except RuntimeError as exc:
        print(f"bench resilience: {exc}", file=sys.stderr)
        return 1
    try:
        rows = [one_variant(plan, name, routing, far_url)
                for _ in range(plan.rounds) for name, routing in VARIANTS.items()]
    except RuntimeError as exc:
        print(f"bench resilience: {exc}", file=sys.stderr)
        return 1
    finally:
        far.stop()
    print(report(plan, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
