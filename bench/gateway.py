"""Gateway benchmark (issue 3): cache hits vs nginx and aiohttp, miss overhead, tier hits.

``python -m bench gateway [--duration S] [--rounds R] [--connections C] [--latency-requests N]
[--latency-rounds N] [--trace-requests N] [--models DIR] [--quick] [--only node] [--no-litellm]``

Everything runs side by side in one run. The servers (gateways, nginx, the hello-world, the
backends) share the first CPU; the load generator (wrk, or the Python client) and Redis get the
last one. Every process is started by this bench and stopped by its PID.

1. Hit throughput, wrk at ``C`` (64) connections, one short text (cached after the first
   request): the gateway (1 worker, embedded L1) vs nginx ``proxy_cache`` serving the same
   cached answer (nginx proxies the gateway and caches POSTs by URI + body) vs a bare aiohttp
   hello-world vs the floor (aiohttp + uvloop answering the gateway's own hit, body and
   headers, pre-encoded); CPU per hit is the server's CPU over its requests. Rounds are
   interleaved (gateway, nginx, hello, floor, gateway, ...); the median counts. A peer a user
   might pick instead runs in the same rounds: the LiteLLM proxy in front of the same backend,
   answering the same embedding from its own response cache (``bench.litellm``: its own venv
   under the bench's cache dir; ``--no-litellm`` leaves it out, and a row that cannot be
   installed or started is skipped with the reason).
2. Miss-path added latency at 1 connection, Python closed loop, every request timed: the same
   OIP request the gateway sends, straight to the backend, vs ``/v1/embeddings`` through the
   gateway with ``Cache-Control: no-store`` (no read, no write: each request goes upstream);
   the same pair again with a 0 ms fake backend, which shows the gateway's own share without
   the model's jitter. Rounds alternate the paths (``bench.gateway_latency``).
3. L2-only hits vs L1 hits, wrk at ``C`` connections over 256 distinct cached texts: a gateway
   with Redis and ``cache.max_entries=1`` (every lookup misses L1 and hits Redis) vs one with Redis
   and the normal L1. /metrics confirms which tier answered.
4. The node tier (``bench.gateway_node``; ``--only node`` runs just this part): node-tier hits vs
   L1 hits over 256 texts as in 3, without Redis; and the hit ratio of a replayed trace of
   repeats with 2 workers vs 1.

Targets (reported, never a failure): L1 hits >= 0.6x the aiohttp floor (the same pre-encoded
answer and headers, ``bench.floor``); added miss p50 <= 0.3 ms; L2 hits >= 0.6x L1 hits;
node-tier hits >= 0.8x L1 hits; the trace's hit ratio with 2 workers equal to 1 worker's.
Exit code 1 when a server would not start or a run had errors; 2 when wrk or
nginx is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import gateway_latency, gateway_node, gateway_throughput, litellm, nginx, services, wrk
from bench.gateway_latency import MissLatency
from bench.gateway_probe import Probe, cache_lookups, capture
from bench.gateway_throughput import Row
from bench.loadgen import Request
from bench.procs import Cores, split_cores
from bench.services import Server

TEXT = "How do I reset my password?"
MODEL = "minilm"
HIT_BODY = orjson.dumps({"input": TEXT, "model": MODEL})
OIP_BODY = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "data": [TEXT]}]})
JSON = {"Content-Type": "application/json"}
L2_TEXTS = 256
TARGET_FLOOR, TARGET_MISS_MS, TARGET_L2 = 0.6, 0.3, 0.6
PATH_OIP = "backend OIP infer, direct"
PATH_V1 = "backend /v1/embeddings, direct"
PATH_GW = "gateway /v1/embeddings -> backend, no-store"
PATH_FAKE = "fake OIP backend (0 ms), direct"
PATH_GW_FAKE = "gateway /v1/embeddings -> fake (0 ms), no-store"


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    models: Path
    duration_s: float  # each timed wrk run
    warmup_s: float
    rounds: int
    connections: int
    latency_requests: int  # per path per round
    latency_rounds: int
    cores: Cores
    trace_requests: int = 2000
    only: str = "all"
    litellm: bool = True  # the LiteLLM proxy's row


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench gateway",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run (10)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved wrk rounds (3)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--latency-requests", type=int, default=400,
                        help="miss-latency requests per path per round (400)")
    parser.add_argument("--latency-rounds", type=int, default=8)
    parser.add_argument("--trace-requests", type=int, default=2000,
                        help="requests in the node tier's replayed trace (2000)")
    parser.add_argument("--only", choices=("all", "node"), default="all",
                        help="run every part, or only the node tier's (4)")
    parser.add_argument("--no-litellm", dest="litellm", action="store_false",
                        help="leave out the LiteLLM proxy's row (it installs into its own venv)")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    args = parser.parse_args(argv)
    if min(args.duration, args.rounds, args.connections, args.latency_requests,
           args.latency_rounds, args.trace_requests) <= 0:
        parser.error("every count and duration must be > 0")
    return Plan(
        models=args.models,
        duration_s=min(args.duration, 3.0) if args.quick else args.duration,
        warmup_s=1.0 if args.quick else 2.0,
        rounds=1 if args.quick else args.rounds,
        connections=args.connections,
        latency_requests=min(args.latency_requests, 100) if args.quick else args.latency_requests,
        latency_rounds=2 if args.quick else args.latency_rounds,
        cores=split_cores(),
        trace_requests=min(args.trace_requests, 600) if args.quick else args.trace_requests,
        only=args.only,
        litellm=args.litellm,
    )


def throughput(plan: Plan, targets: Sequence[gateway_throughput.Target]) -> None:
    """Interleaved wrk rounds over ``targets`` as the plan says."""
    gateway_throughput.measure(targets, headers=JSON, connections=plan.connections,
                               duration_s=plan.duration_s, warmup_s=plan.warmup_s,
                               rounds=plan.rounds, cores=plan.cores.client)


def miss_paths(backend: Server, gateway: Server, fake: Server, gw_fake: Server
               ) -> list[tuple[str, Request]]:
    """The miss-latency paths: the real backend direct (OIP, as the gateway calls it, and
    /v1/embeddings) and through the gateway; a 0 ms fake backend direct and through a gateway."""
    no_store = {**JSON, "Cache-Control": "no-store"}
    oip = f"/v2/models/{MODEL}/infer"
    return [
        (PATH_OIP, Request(url=backend.url + oip, body=OIP_BODY, headers=JSON)),
        (PATH_V1, Request(url=backend.url + "/v1/embeddings", body=HIT_BODY, headers=JSON)),
        (PATH_GW, Request(url=gateway.url + "/v1/embeddings", body=HIT_BODY, headers=no_store)),
        (PATH_FAKE, Request(url=fake.url + oip, body=OIP_BODY, headers=JSON)),
        (PATH_GW_FAKE, Request(url=gw_fake.url + "/v1/embeddings", body=HIT_BODY,
                               headers=no_store)),
    ]


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    plan = parse(argv)
    missing = [t for t, ok in (("wrk", wrk.available()), ("nginx", nginx.available())) if not ok]
    if missing:
        print(f"bench gateway: {', '.join(missing)} not installed (Debian: apt-get install -y "
              "wrk nginx)", file=sys.stderr)
        return 2
    if plan.only == "node":
        return _node_only(plan)
    server, client = plan.cores.server, plan.cores.client
    hits = [Row("gateway, L1 hit"), Row("nginx proxy_cache hit"), Row("aiohttp hello-world"),
            Row("aiohttp floor: the same answer and headers, pre-encoded")]
    tiers = [Row("gateway, L1 hit (Redis on, node tier off, normal L1)"),
             Row("gateway, L2 hit (Redis on, node tier off, cache.max_entries=1)")]
    probes: dict[str, Probe] = {}
    latency = MissLatency()
    node = gateway_node.NodeBench()
    peer = litellm.Peer(reason="" if plan.litellm else "left out (--no-litellm)")
    stack = contextlib.ExitStack()
    try:
        with stack:
            backend = stack.enter_context(services.backend(plan.models, cores=server))
            redis = stack.enter_context(services.redis(cores=client))
            url = services.redis_url(redis)
            gw = stack.enter_context(services.gateway(backend.url, cores=server))
            # The L1/L2 pair runs without the node tier: L2 hits must come from Redis.
            gw_l1 = stack.enter_context(services.gateway(
                backend.url, cores=server, redis_url=url, name="gateway-l1",
                settings={"cache.node.enabled": False}))
            gw_l2 = stack.enter_context(services.gateway(
                backend.url, cores=server, redis_url=url, name="gateway-l2",
                settings={"cache.max_entries": 1, "cache.node.enabled": False}))
            proxy = stack.enter_context(nginx.NginxCache(gw.host_port, cores=server))
            hello = stack.enter_context(services.hello(cores=server))
            ngx = services.Server(proxy.service, proxy.port)

            probes["gateway"] = Probe.check(gw.url, HIT_BODY, "X-Cache", "HIT")
            probes["nginx"] = Probe.check(ngx.url, HIT_BODY, "X-Nginx-Cache", "HIT")
            answer = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "hit.json"
            capture(gw.url, HIT_BODY, answer)
            bare = stack.enter_context(services.floor(answer, cores=server))
            lite = (stack.enter_context(litellm.serving(peer, backend.url, HIT_BODY,
                                                        cores=server))
                    if plan.litellm else None)
            path = "/v1/embeddings"
            calls = litellm.backend_requests(backend.url)
            throughput(plan, [(hits[0], gw, [HIT_BODY], path), (hits[1], ngx, [HIT_BODY], path),
                              (hits[2], hello, [HIT_BODY], path),
                              (hits[3], bare, [HIT_BODY], path),
                              *([(peer.row, lite, [HIT_BODY], path)] if lite else [])])
            if lite is not None:
                peer.backend_calls = litellm.backend_requests(backend.url) - calls
                lite.stop()  # idle from here on; its memory back for the other parts

            bodies = [orjson.dumps({"input": f"cache tier bench text number {i}",
                                    "model": MODEL}) for i in range(L2_TEXTS)]
            probes["L2 warm"] = Probe.warm(gw_l2.url, bodies)
            probes["L1 warm"] = Probe.warm(gw_l1.url, bodies)
            before = {name: cache_lookups(s.url) for name, s in (("l1", gw_l1), ("l2", gw_l2))}
            throughput(plan, [(tiers[0], gw_l1, bodies, path), (tiers[1], gw_l2, bodies, path)])
            after = {name: cache_lookups(s.url) for name, s in (("l1", gw_l1), ("l2", gw_l2))}
            for row, name in ((tiers[0], "l1"), (tiers[1], "l2")):
                delta = {k: v - before[name].get(k, 0.0) for k, v in after[name].items()}
                row.note = ", ".join(f"{k} {v:.0f}" for k, v in sorted(delta.items()) if v)
            gateway_node.measure(node, backend.url, cores=server, stack=stack,
                                 throughput=lambda targets: throughput(plan, targets),
                                 trace_requests=plan.trace_requests)

            fake = stack.enter_context(services.slow_backend(cores=server, slots=64,
                                                             service_ms=0))
            gw_fake = stack.enter_context(services.gateway(fake.url, cores=server,
                                                           name="gateway-fake"))
            latency = gateway_latency.measure(
                miss_paths(backend, gw, fake, gw_fake), rounds=plan.latency_rounds,
                requests=plan.latency_requests, cores=client)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"bench gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(report(plan, hits, tiers, latency, probes, node, peer))
        return 1
    print(report(plan, hits, tiers, latency, probes, node, peer), flush=True)
    failed = latency.errors or any(r.errors for r in hits + tiers + node.rows)
    return 1 if failed or not all(p.ok for p in {**probes, **node.probes}.values()) else 0


def _node_only(plan: Plan) -> int:
    """``--only node``: the backend and part 4 alone."""
    node = gateway_node.NodeBench()
    try:
        with contextlib.ExitStack() as stack:
            backend = stack.enter_context(services.backend(plan.models, cores=plan.cores.server))
            gateway_node.measure(node, backend.url, cores=plan.cores.server, stack=stack,
                                 throughput=lambda targets: throughput(plan, targets),
                                 trace_requests=plan.trace_requests)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"bench gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("\n".join(_node_report(plan, node)))
        return 1
    print("\n".join(_node_report(plan, node)), flush=True)
    failed = any(r.errors for r in node.rows) or not all(p.ok for p in node.probes.values())
    return 1 if failed else 0


def _node_report(plan: Plan, node: gateway_node.NodeBench) -> list[str]:
    return [*_method(plan), *gateway_throughput.HEADER, *(r.markdown() for r in node.rows), "",
            "| target | measured | goal | met |", "| --- | ---: | ---: | :---: |",
            *node.targets(), *node.notes(),
            *(f"- Check {name}: {probe.describe()}" for name, probe in node.probes.items())]


def _method(plan: Plan) -> list[str]:
    return [
        f"Machine: {_cpu_name()}, {os.cpu_count()} logical CPUs; Python "
        f"{platform.python_version()}. Pinning: {plan.cores.describe()}. The backends share the "
        "server CPU (idle but for health checks during the throughput runs; at 1 connection "
        "only one process works at a time, and both miss paths then cross between the CPUs "
        "twice); Redis runs on the load generator's CPU.",
        "",
        f"Throughput: wrk, 1 thread, {plan.connections} connections, median of {plan.rounds} "
        f"interleaved run(s) of {plan.duration_s:g} s after a {plan.warmup_s:g} s warm-up each. "
        "CPU columns: cores used by the server (nginx: master + worker), by wrk, and by every "
        "other process on the machine (a shared machine's noise; 0 when it was quiet).",
        "",
    ]


def report(plan: Plan, hits: list[Row], tiers: list[Row], latency: MissLatency,
           probes: dict[str, Probe], node: gateway_node.NodeBench,
           peer: litellm.Peer | None = None) -> str:
    """The Markdown report: method, throughput and latency tables, targets, notes."""
    lines = [
        *_method(plan),
        *gateway_throughput.HEADER,
        *(r.markdown() for r in hits),
        *([peer.markdown()] if peer else []),
        *(r.markdown() for r in tiers + node.rows),
        "",
    ]
    if latency.paths and any(p.latency for p in latency.paths.values()):
        lines += [
            f"Miss path at 1 connection: Python closed loop, {plan.latency_rounds} alternating "
            f"rounds x {plan.latency_requests} requests per path; the same text every time.",
            "",
            *latency.table(),
            "",
        ]
    gw, ngx, hello, floor = (r.rps for r in hits)
    l1, l2 = (r.rps for r in tiers)
    added = latency.p50(PATH_GW) - latency.p50(PATH_OIP)
    paths = latency.paths
    outside = (paths[PATH_GW].outside_p50 - paths[PATH_OIP].outside_p50
               if PATH_GW in paths and PATH_OIP in paths else float("nan"))
    lines += [
        "| target | measured | goal | met |",
        "| --- | ---: | ---: | :---: |",
        _target("gateway L1-hit req/s / aiohttp floor (same answer)", _ratio(gw, floor),
                TARGET_FLOOR, True),
        _info("floor's CPU per hit / gateway's CPU per hit",
              _ratio(_cpu_per_request(hits[3]), _cpu_per_request(hits[0]))),
        _info("gateway hit req/s / nginx proxy_cache", _ratio(gw, ngx)),
        _info("gateway hit req/s / aiohttp hello-world", _ratio(gw, hello)),
        *(peer.targets(hits[0]) if peer else []),
        _target("added p50 on a miss, ms (gateway vs backend OIP direct)", added,
                TARGET_MISS_MS, False),
        _info("added p50, ms, outside the backend's queue+compute",
              outside),
        _info("added p50, ms, vs backend /v1/embeddings direct",
              latency.p50(PATH_GW) - latency.p50(PATH_V1)),
        _info("added p50, ms, with a 0 ms fake backend",
              latency.p50(PATH_GW_FAKE) - latency.p50(PATH_FAKE)),
        _target("L2-hit req/s / L1-hit req/s", _ratio(l2, l1), TARGET_L2, True),
        *node.targets(),
        "",
    ]
    if PATH_GW in paths:
        timing = paths[PATH_GW].timing
        parts = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in timing.items() if v)
        lines.append(f"- Gateway Server-Timing medians on the real miss path (ms): {parts}")
    for row in tiers:
        if row.note:
            lines.append(f"- {row.name}: cache lookups during the timed runs: {row.note}")
    lines += peer.notes() if peer else []
    lines += node.notes()
    for name, probe in {**probes, **node.probes}.items():
        lines.append(f"- Check {name}: {probe.describe()}")
    return "\n".join(lines)


def _cpu_per_request(row: Row) -> float:
    """Server CPU seconds per answered request in the median run (nan before any run)."""
    m = row.median
    if m is None or not row.cpu or m.rps <= 0:
        return float("nan")
    return statistics.median(row.cpu) / m.rps


def _info(name: str, value: float) -> str:
    return f"| {name} (info) | {value:.3f} | - | - |"


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def _target(name: str, value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    sign = ">=" if at_least else "<="
    return f"| {name} | {value:.3f} | {sign} {goal:g} | {'yes' if met else 'NO'} |"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
