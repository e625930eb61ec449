"""Miss-path latency at one connection: each path timed per request, paths in alternating rounds.

The gateway bench compares calling a backend directly with calling it through the gateway (with
``Cache-Control: no-store``, so every request goes upstream). Every path is measured the same
way: one Python closed-loop client, one keep-alive connection per server, rounds alternating
the paths so drift on a shared machine hits them all alike. Each answer's ``Server-Timing``
(the backend's ``queue`` and ``compute``, which the gateway passes on) is recorded beside the
client's latency, so a report can also give the latency *outside* the backend's own work, which
does not move with the model's compute-time jitter.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import loadgen
from bench.gateway_probe import server_timing
from bench.loadgen import LoadResult, Request, RequestFactory
from bench.procs import pinned


@dataclass
class PathSamples:
    """One path's samples, in milliseconds."""

    name: str
    latency: list[float] = field(default_factory=list)
    backend: list[float] = field(default_factory=list)  # queue + compute the backend reported
    timing: dict[str, list[float]] = field(default_factory=dict)  # every Server-Timing entry

    def p(self, q: float) -> float:
        """The ``q``-th percentile of the client-observed latency."""
        return loadgen.percentile(self.latency, q)

    @property
    def backend_p50(self) -> float:
        values = [v for v in self.backend if not math.isnan(v)]
        return statistics.median(values) if values else math.nan

    @property
    def outside_p50(self) -> float:
        """Median of (latency - the backend's queue + compute), per request."""
        values = [t - b for t, b in zip(self.latency, self.backend, strict=True)
                  if not math.isnan(b)]
        return statistics.median(values) if values else math.nan


@dataclass
class MissLatency:
    """Every path's samples and how many requests failed."""

    paths: dict[str, PathSamples] = field(default_factory=dict)
    errors: int = 0

    def p50(self, name: str) -> float:
        path = self.paths.get(name)
        return path.p(50) if path is not None and path.latency else math.nan

    def table(self) -> list[str]:
        """Markdown rows, one per path."""
        lines = [
            "| path | requests | p50 ms | p90 ms | p99 ms | backend queue+compute p50 ms "
            "| p50 of latency minus backend time, ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for path in self.paths.values():
            if path.latency:
                lines.append(
                    f"| {path.name} | {len(path.latency)} | {path.p(50):.3f} | {path.p(90):.3f} "
                    f"| {path.p(99):.3f} | {_fmt(path.backend_p50)} | {_fmt(path.outside_p50)} |")
        return lines


def measure(paths: Sequence[tuple[str, Request]], *, rounds: int, requests: int,
            cores: frozenset[int], warmup: int = 50) -> MissLatency:
    """``rounds`` rounds of ``requests`` sequential requests per path, paths alternating,
    the client pinned to ``cores``."""
    out = MissLatency({name: PathSamples(name) for name, _ in paths})

    async def go() -> None:
        async with loadgen.client_session(pool=len(paths) + 1) as http:
            for _name, request in paths:  # open each connection, warm each server's code
                await loadgen.run_closed(_always(request), requests=warmup, concurrency=1,
                                         max_duration_s=30, session=http)
            for _ in range(rounds):
                for name, request in paths:
                    result = await loadgen.run_closed(
                        _always(request), requests=requests, concurrency=1, max_duration_s=60,
                        session=http, inspect=server_timing)
                    _collect(out, out.paths[name], result)

    with pinned(cores):
        loadgen.run(go())
    return out


def _always(request: Request) -> RequestFactory:
    """A factory that sends ``request`` every time."""
    return lambda _index: request


def _collect(out: MissLatency, path: PathSamples, result: LoadResult) -> None:
    out.errors += len(result.samples) - len(result.ok)
    for sample in result.ok:
        info = sample.info or {}
        path.latency.append(sample.latency_s * 1000.0)
        if "queue" in info and "compute" in info:
            path.backend.append(info["queue"] + info["compute"])
        else:
            path.backend.append(math.nan)
        for key, value in info.items():
            path.timing.setdefault(key, []).append(value)


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"
