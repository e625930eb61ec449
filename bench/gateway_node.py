"""The node tier in the gateway bench: its hits against L1 hits, and one cache for all workers.

1. Node-tier hits vs L1 hits, wrk at ``C`` connections over 256 distinct cached texts: a gateway
   with ``cache.max_entries=1`` (every lookup misses L1 and reads the node tier) vs one with the
   normal L1; no Redis. /metrics confirms which tier answered. An L1 hit is usually answered by
   the hot-answer shortcut (gateway/pipeline/hot_answers.py), which only trusts entries L1 holds;
   the same pair
   again with hot answers off (``logging.request_text``, the one setting that turns them off)
   compares the tiers on the same path.
2. A replayed trace of repeats: ``requests`` texts drawn from ``distinct`` ones with Zipf
   weights (seeded, so every run replays the same trace), sent one at a time, each on a new
   connection so the kernel spreads them over the workers; the hit ratio is the share of
   ``X-Cache: HIT`` answers. A gateway with 1 worker, one with 2 (they share the node tier),
   and, for comparison, 2 workers with the node tier off (each worker only its own L1).

Each gateway has its own empty node directory (``services.gateway``).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from bench import gateway_throughput, services
from bench.gateway_probe import Probe, cache_lookups, fetch
from bench.gateway_throughput import Row

NODE_TEXTS = 256
TARGET_NODE = 0.8
TRACE_DISTINCT = 200
TRACE_SEED = 11
METRICS_FLUSH_S = 1.5
Throughput = Callable[[Sequence[gateway_throughput.Target]], None]


@dataclass
class TraceRun:
    """One replay of the trace against one gateway."""

    name: str
    statuses: Counter[str] = field(default_factory=Counter)
    node_hits: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def hit_ratio(self) -> float:
        return self.statuses["HIT"] / self.requests if self.requests else float("nan")

    def markdown(self) -> str:
        """One row: requests, hits, misses, hit ratio, node-tier hits."""
        return (f"| {self.name} | {self.requests} | {self.statuses['HIT']} | "
                f"{self.statuses['MISS']} | {self.hit_ratio:.4f} | {self.node_hits:.0f} |")


@dataclass
class NodeBench:
    """What the node-tier part measured."""

    rows: list[Row] = field(default_factory=lambda: [
        Row("gateway, L1 hit (node tier on, normal L1)"),
        Row("gateway, node-tier hit (cache.max_entries=1)"),
        Row("gateway, L1 hit, hot answers off"),
        Row("gateway, node-tier hit, hot answers off")])
    trace: list[TraceRun] = field(default_factory=list)
    probes: dict[str, Probe] = field(default_factory=dict)
    trace_requests: int = 0

    def targets(self) -> list[str]:
        """Target rows for the report's target table."""
        l1, node, l1_full, node_full = (r.rps for r in self.rows)
        cpu = [_cpu_per_answer(r) for r in self.rows]
        lines = [_target("node-tier-hit req/s / L1-hit req/s", _ratio(node, l1), TARGET_NODE),
                 # Server CPU per answer does not depend on how much CPU other processes left.
                 _info("L1 hit's server CPU per answer / node-tier hit's", _ratio(cpu[0], cpu[1])),
                 _info("same, hot answers off: req/s ratio", _ratio(node_full, l1_full)),
                 _info("same, hot answers off: CPU per answer ratio", _ratio(cpu[2], cpu[3]))]
        if len(self.trace) >= 2:
            one, two = self.trace[0].hit_ratio, self.trace[1].hit_ratio
            lines.append(_target("trace hit ratio, 2 workers / 1 worker", _ratio(two, one), 1.0))
        return lines

    def notes(self) -> list[str]:
        """The trace table and the lookup counts, as report lines."""
        lines = [f"- {r.name}: cache lookups during the timed runs: {r.note}"
                 for r in self.rows if r.note]
        if self.trace:
            lines += [
                "",
                f"Trace replay: {self.trace_requests} requests over {TRACE_DISTINCT} distinct "
                f"texts (Zipf, s=1, seed {TRACE_SEED}), one at a time, a new connection each.",
                "",
                "| gateway | requests | HIT | MISS | hit ratio | node-tier hits |",
                "| --- | ---: | ---: | ---: | ---: | ---: |",
                *(run.markdown() for run in self.trace),
            ]
        return lines


def trace(requests: int, distinct: int = TRACE_DISTINCT, seed: int = TRACE_SEED) -> list[int]:
    """Text indexes with Zipf weights (1/rank): a few texts repeat often, most rarely."""
    weights = [1.0 / (rank + 1) for rank in range(distinct)]
    return random.Random(seed).choices(range(distinct), weights=weights, k=requests)


def replay(base_url: str, bodies: Sequence[bytes], order: Sequence[int]) -> Counter[str]:
    """Sends the trace one request at a time (urllib: a new connection each); X-Cache counts."""
    seen: Counter[str] = Counter()
    for i in order:
        status, headers = fetch(base_url, bodies[i])
        seen[headers.get("X-Cache", f"status {status}")] += 1
    return seen


def measure(bench: NodeBench, backend_url: str, *, cores: frozenset[int] | None,
            throughput: Throughput, trace_requests: int,
            stack: contextlib.ExitStack) -> None:
    """Runs both parts, filling ``bench`` as it goes (a failure keeps what was measured)."""
    path = "/v1/embeddings"
    bodies = [orjson.dumps({"input": f"node tier bench text number {i}", "model": "minilm"})
              for i in range(NODE_TEXTS)]
    servers = []
    for name, settings in (("l1", {}), ("node", {"cache.max_entries": 1}),
                           ("l1-full", {"logging.request_text": True}),
                           ("node-full", {"logging.request_text": True, "cache.max_entries": 1})):
        server = stack.enter_context(services.gateway(backend_url, cores=cores,
                                                      settings=settings, name=f"gateway-{name}"))
        bench.probes[f"{name} warm"] = Probe.warm(server.url, bodies)
        servers.append(server)
    before = [cache_lookups(s.url) for s in servers]
    throughput([(row, server, bodies, path)
                for row, server in zip(bench.rows, servers, strict=True)])
    for row, server, was in zip(bench.rows, servers, before, strict=True):
        delta = {k: v - was.get(k, 0.0) for k, v in cache_lookups(server.url).items()}
        row.note = ", ".join(f"{k} {v:.0f}" for k, v in sorted(delta.items()) if v)

    bench.trace_requests = trace_requests
    order = trace(trace_requests)
    texts = [orjson.dumps({"input": f"trace text {i}", "model": "minilm"})
             for i in range(TRACE_DISTINCT)]
    for name, workers, settings in (
            ("1 worker, node tier on", 1, {}),
            ("2 workers, node tier on", 2, {}),
            ("2 workers, node tier off (info)", 2, {"cache.node.enabled": False})):
        with services.gateway(backend_url, cores=cores, workers=workers, settings=settings,
                              name=f"gateway-trace-{workers}") as gw:
            run = TraceRun(name, replay(gw.url, texts, order))
            time.sleep(METRICS_FLUSH_S)  # each worker hands its counts over once a second
            run.node_hits = cache_lookups(gw.url).get("node hit", 0.0)
            bench.trace.append(run)


def _cpu_per_answer(row: Row) -> float:
    m = row.median
    if m is None or not row.cpu or m.rps <= 0:
        return float("nan")
    return statistics.median(row.cpu) / m.rps


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def _info(name: str, value: float) -> str:
    return f"| {name} (info) | {value:.3f} | - | - |"


def _target(name: str, value: float, goal: float) -> str:
    return f"| {name} | {value:.3f} | >= {goal:g} | {'yes' if value >= goal else 'NO'} |"
