"""Soak with faults: ``python -m bench soak [--duration SECONDS] [--workers N] [--concurrency C]``.

A real gateway (tenants file, policy folder, Redis) in front of a real backend, all on loopback
ports and stopped by PID, takes mixed traffic (``bench.soak_traffic``) for ``--duration``
seconds (600 by default) while, in turn, the backend is killed and restarted, frozen
(SIGSTOP/SIGCONT), Redis is killed and restarted, frozen, and a bad policy file is written and
then fixed. Steady phases separate the faults.

Reported and checked:
- per phase: requests, statuses, X-Cache mix, p50/p99 latency;
- every 200 against a fresh computation by the backend; no tenant served another's entry; PII
  never cached: no Redis key in the PII tenant's scope, no PII text in any Redis key or value;
- statuses: a 500 or no answer is always a violation; steady phases, Redis faults and the bad
  policy must answer 200 only (the gateway fails open on Redis, keeps the last good policy);
  backend faults may answer 502/503/504 for what the cache cannot serve;
- RSS and open file descriptors of the gateway and the backend over time: after the run the
  gateway's descriptors are back within 10 of the warm count, RSS growth stays under a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import redis.asyncio as aioredis
import yaml

from bench.procs import Service, clean_env, free_port
from bench.soak_traffic import PII_MARKERS, PII_TENANT, TENANTS, Sample, Traffic, sleep_until

REPO = Path(__file__).resolve().parent.parent
FAULTS = ("backend-kill", "backend-freeze", "redis-kill", "redis-freeze", "bad-policy")
BACKEND_FAULT_STATUSES = frozenset({200, 502, 503, 504})
FD_SLACK = 10
RSS_GROWTH_MB = 150.0
POLICY = """\
version: {version}
defaults:
  ttl: 1h
  stale_if_error: 10m
  privacy:
    detectors: {{email: no_store, phone: no_store, card: no_store, us_ssn: no_store,
                iban: no_store, ip: no_store, secret: no_store}}
rules:
  - name: globex-truncates
    match: {{tenants: [globex]}}
    normalization: {{max_chars: 24, on_overflow: truncate}}
  - name: default
"""
BAD_POLICY = "version: soak-broken\nrules:\n  - name: default\n    ttl: forever\n"


@dataclass(slots=True)
class ResourceSample:
    t: float
    phase: str
    process: str
    pid: int
    rss_mb: float
    fds: int


@dataclass
class SoakReport:
    """Everything a run measured and every violation it found."""

    duration_s: float = 0.0
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # name, start, end
    samples: list[Sample] = field(default_factory=list)
    resources: list[ResourceSample] = field(default_factory=list)
    violations: dict[str, list[str]] = field(default_factory=dict)
    verified: int = 0
    policy_failures: float = 0.0
    warm: dict[str, ResourceSample] = field(default_factory=dict)
    final: dict[str, ResourceSample] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)  # every process the run started

    def add(self, kind: str, message: str) -> None:
        self.violations.setdefault(kind, []).append(message)

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not any(self.violations.values())


class Stack:
    """The backend, Redis and gateway of one run, each restartable on its own port."""

    def __init__(self, models: Path, workdir: Path, *, workers: int) -> None:
        self.models = models
        self.workdir = workdir
        self.workers = workers
        self.backend_port = free_port()
        self.redis_port = free_port()
        self.gateway_port = free_port()
        self.keys = {t: secrets.token_urlsafe(24) for t in (*TENANTS, PII_TENANT)}
        self.policy = workdir / "policies" / "policy.yaml"
        self.backend: Service | None = None
        self.redis: Service | None = None
        self.gateway: Service | None = None
        self.started: list[int] = []  # every PID, restarts included

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def backend_url(self) -> str:
        return f"http://127.0.0.1:{self.backend_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        self.policy.parent.mkdir(parents=True, exist_ok=True)
        self.policy.write_text(POLICY.format(version="soak-1"))
        tenants = {"tenants": {t: {"api_keys_sha256": [hashlib.sha256(k.encode()).hexdigest()]}
                               for t, k in self.keys.items()}}
        (self.workdir / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        config = {"backends": [self.backend_url], "redis": {"url": self.redis_url},
                  "policies": {"path": str(self.policy.parent), "poll_interval_s": 0.5},
                  "tenants_file": str(self.workdir / "tenants.yaml"), "workers": self.workers,
                  # A node tier of its own: the default directory outlives the run, and
                  # entries from an earlier run would read as answers nobody sent.
                  "cache": {"max_entries": 2000,
                            "node": {"path": str(self.workdir / "node-cache")}},
                  "routing": {"health_interval_s": 0.5},
                  "logging": {"level": "WARNING"}}
        (self.workdir / "gateway.yaml").write_text(yaml.safe_dump(config))
        self.start_redis()
        self.start_backend()
        argv = [sys.executable, "-m", "gateway", "serve", "--config",
                str(self.workdir / "gateway.yaml"), "--host", "127.0.0.1", "--port",
                str(self.gateway_port)]
        self.gateway = Service("soak-gateway", argv, env=clean_env(), cwd=str(REPO)).start()
        self.started.append(self.gateway.pid)
        self.gateway.wait_http(self.gateway_url + "/readyz", timeout_s=60.0)

    def start_backend(self) -> None:
        argv = [sys.executable, "-m", "backend", "serve", "--models", str(self.models),
                "--host", "127.0.0.1", "--port", str(self.backend_port), "--threads", "1",
                "--device", "cpu", "--log-level", "WARNING"]
        self.backend = Service("soak-backend", argv, cwd=str(REPO)).start()
        self.started.append(self.backend.pid)
        self.backend.wait_http(self.backend_url + "/v2/health/ready", timeout_s=240.0)

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install "
                               "redis-server)")
        argv = [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes"]
        self.redis = Service("soak-redis", argv).start()
        self.started.append(self.redis.pid)
        _wait_redis(self.redis, self.redis_port)

    def signal(self, service: Service | None, sig: int) -> None:
        if service is not None and service.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(service.pid, sig)

    def kill(self, service: Service | None) -> None:
        """SIGKILL by PID and reap."""
        if service is not None and service.proc is not None:
            self.signal(service, signal.SIGKILL)
            service.proc.wait(timeout=30)
            service.stop()  # closes its log

    def stop(self) -> None:
        """Thaw whatever a fault froze, then stop every process by PID."""
        for service in (self.gateway, self.backend, self.redis):
            self.signal(service, signal.SIGCONT)
        for service in (self.gateway, self.backend, self.redis):
            if service is not None:
                service.stop()

    def pids(self) -> dict[str, list[int]]:
        """Process name -> PIDs (the gateway's workers too when it supervises)."""
        found: dict[str, list[int]] = {}
        for name, service in (("gateway", self.gateway), ("backend", self.backend)):
            if service is not None and service.alive():
                found[name] = [service.pid, *_children(service.pid)]
        return found


def _wait_redis(service: Service, port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"redis exited early:\n{service.log_tail()}")
        with contextlib.suppress(OSError), \
                socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError("redis did not answer PING")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return 0


class Soak:
    """One run: traffic loops, a resource sampler and the fault schedule."""

    def __init__(self, stack: Stack, *, duration_s: float, concurrency: int, pause_s: float,
                 seed: int, sample_every_s: float, log: Callable[[str], None]) -> None:
        self.stack = stack
        self.duration_s = duration_s
        self.concurrency = concurrency
        self.pause_s = pause_s
        self.sample_every_s = sample_every_s
        self.log = log
        self.traffic = Traffic(stack.gateway_url, stack.backend_url, stack.keys, seed=seed)
        self.report = SoakReport()
        self.phase = "start"
        self.stopping = asyncio.Event()
        self.started = time.monotonic()

    def sample_resources(self) -> dict[str, ResourceSample]:
        now = time.monotonic() - self.started
        out = {}
        for name, pids in self.stack.pids().items():
            sample = ResourceSample(now, self.phase, name, pids[0],
                                    sum(_rss_mb(p) for p in pids), sum(_fds(p) for p in pids))
            self.report.resources.append(sample)
            out[name] = sample
        return out

    async def _sampler(self) -> None:
        while not self.stopping.is_set():
            self.sample_resources()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.sample_every_s)

    async def _load(self, session: aiohttp.ClientSession, max_requests: int) -> None:
        for _ in range(max_requests):
            if self.stopping.is_set():
                return
            self.report.samples.append(await self.traffic.one(session, self.phase))
            await asyncio.sleep(self.pause_s)

    async def _verifier(self, session: aiohttp.ClientSession) -> None:
        while not self.stopping.is_set():
            await self.traffic.verify(session)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.5)

    async def run(self) -> SoakReport:
        slot = self.duration_s / (len(FAULTS) * 2 + 1)
        timeout = aiohttp.ClientTimeout(total=15)
        connector = aiohttp.TCPConnector(limit=self.concurrency * 2 + 4)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            max_requests = int(self.duration_s * 400) + 1000  # a bound, far above the rate
            tasks = [asyncio.create_task(self._load(session, max_requests))
                     for _ in range(self.concurrency)]
            tasks += [asyncio.create_task(self._sampler()),
                      asyncio.create_task(self._verifier(session))]
            try:
                await self._steady("steady-0", slot)
                self.report.warm = self.sample_resources()
                for i, fault in enumerate(FAULTS, 1):
                    await self._fault(fault, slot, session)
                    await self._steady(f"steady-{i}", slot)
            finally:
                self.stopping.set()
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._finish(session)
        return self.report

    async def _steady(self, name: str, seconds: float) -> None:
        self._begin(name)
        await sleep_until(time.monotonic() + seconds)
        await self._check_redis()
        self._end()

    def _begin(self, name: str) -> None:
        self.phase = name
        self.report.phases.append((name, time.monotonic() - self.started, 0.0))
        self.log(f"soak: {name}")

    def _end(self) -> None:
        name, start, _ = self.report.phases[-1]
        self.report.phases[-1] = (name, start, time.monotonic() - self.started)

    async def _fault(self, fault: str, hold_s: float, session: aiohttp.ClientSession) -> None:
        stack = self.stack
        self._begin(fault)
        end = time.monotonic() + hold_s
        if fault == "backend-kill":
            stack.kill(stack.backend)
            await sleep_until(end)
            await asyncio.to_thread(stack.start_backend)
        elif fault == "backend-freeze":
            stack.signal(stack.backend, signal.SIGSTOP)
            await sleep_until(end)
            stack.signal(stack.backend, signal.SIGCONT)
        elif fault == "redis-kill":
            await self._check_redis()
            stack.kill(stack.redis)
            await sleep_until(end)
            await asyncio.to_thread(stack.start_redis)
        elif fault == "redis-freeze":
            await self._check_redis()
            stack.signal(stack.redis, signal.SIGSTOP)
            await sleep_until(end)
            stack.signal(stack.redis, signal.SIGCONT)
        else:
            before = await self._policy_failures(session)
            stack.policy.write_text(BAD_POLICY)
            await sleep_until(max(end, time.monotonic() + 2.0))  # several polls of 0.5 s
            self.report.policy_failures = await self._policy_failures(session) - before
            if self.report.policy_failures < 1:
                self.report.add("bad policy", "no failed reload counted for the bad file")
            stack.policy.write_text(POLICY.format(version="soak-2"))
        await self._healed(session, fault)
        self._end()

    async def _healed(self, session: aiohttp.ClientSession, fault: str) -> None:
        """Wait (at most 120 s) until the gateway is ready and answers a fresh text with 200
        (after the policy fix: under the new policy version)."""
        deadline = time.monotonic() + 120.0
        headers = {"Authorization": f"Bearer {self.stack.keys['acme']}"}
        url = self.stack.gateway_url
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url + "/readyz") as ready:
                    ok = ready.status == 200
                body = {"model": "minilm", "input": f"heal probe {time.monotonic()}"}
                async with session.post(url + "/v1/embeddings", json=body,
                                        headers=headers) as resp:
                    policy = resp.headers.get("X-Cache-Policy", "")
                    if ok and resp.status == 200 and (
                            fault != "bad-policy" or "soak-2" in policy):
                        return
            await asyncio.sleep(0.2)
        self.report.add("recovery", f"{fault}: the gateway did not recover within 120 s")

    async def _policy_failures(self, session: aiohttp.ClientSession) -> float:
        async with session.get(self.stack.gateway_url + "/metrics") as resp:
            text = await resp.text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gateway_policy_reloads_total{")
                   and 'result="failure"' in line)

    async def _check_redis(self) -> None:
        """No key in the PII tenant's scope, no PII text in any key or value (Redis is up)."""
        from gateway.cache.keys import scope_tag

        tag = scope_tag(PII_TENANT).encode()
        client = aioredis.from_url(self.stack.redis_url, socket_timeout=5)
        try:
            async for key in client.scan_iter(match="*", count=500):
                # Cache entries are strings; other keys (the batch stream) are checked by name.
                kind = await client.type(key)
                value = (await client.get(key) or b"") if kind == b"string" else b""
                if tag in key.split(b":"):
                    self.report.add("PII in Redis", f"{self.phase}: a key in the PII tenant's "
                                    f"scope: {key[:80]!r}")
                for marker in PII_MARKERS:
                    if marker in key or marker in value:
                        self.report.add("PII in Redis", f"{self.phase}: {marker!r} in {key!r}")
        except (aioredis.RedisError, OSError) as exc:
            self.report.add("redis scan", f"{self.phase}: {type(exc).__name__}: {exc}")
        finally:
            await client.aclose()

    async def _finish(self, session: aiohttp.ClientSession) -> None:
        for _ in range(500):  # every answer compared; the backend is up again
            if not self.traffic.pending or not await self.traffic.verify(session, limit=500):
                break
        if self.traffic.pending:
            self.report.add("unverified", f"{len(self.traffic.pending)} answers not verified")
        await asyncio.sleep(1.0)  # connections the run left idle may close
        self.phase = "end"
        self.report.final = self.sample_resources()
        self.report.verified = self.traffic.checks.verified
        self.report.duration_s = time.monotonic() - self.started
        for kind, found in self.traffic.checks.all().items():
            for message in found:
                self.report.add(kind, message)
        self._judge()

    def _judge(self) -> None:
        """Statuses by phase: a request is judged by the most lenient phase it overlapped (one
        in flight when the backend was killed may fail although it started in a steady phase).
        """
        for sample in self.report.samples:
            end = sample.t - self.started
            faults = {name for name, start, stop in self.report.phases
                      if start <= end and (stop == 0.0 or stop >= end - sample.latency_s)}
            status = sample.status
            where = f"{sample.phase} {sample.kind} at {end:.1f} s: {status}"
            if status == 500:
                self.report.add("500", f"{where} {sample.detail}")
            elif faults & {"backend-kill", "backend-freeze"}:
                if status not in BACKEND_FAULT_STATUSES:
                    self.report.add("status", f"{where} {sample.detail}")
            elif status not in (0, 200):
                self.report.add("status", f"{where} {sample.detail}")
        for name in ("gateway", "backend"):
            warm, final = self.report.warm.get(name), self.report.final.get(name)
            if warm is None or final is None:
                self.report.add("resources", f"{name}: not sampled at warm-up and at the end")
                continue
            # The backend at the end is the one restarted by backend-kill: same bounds, wider
            # for RSS (ONNX Runtime's arenas grow with the batch shapes it has seen).
            rss_bound = RSS_GROWTH_MB if name == "gateway" else 2 * RSS_GROWTH_MB
            if final.fds > warm.fds + FD_SLACK:
                self.report.add("resources", f"{name} fds {warm.fds} -> {final.fds}")
            if final.rss_mb > warm.rss_mb + rss_bound:
                self.report.add("resources",
                                f"{name} RSS {warm.rss_mb:.0f} -> {final.rss_mb:.0f} MB")


def run(duration_s: float, *, models: Path, workers: int = 1, concurrency: int = 4,
        pause_s: float = 0.002, seed: int = 0, sample_every_s: float = 2.0,
        log: Callable[[str], None] = print) -> SoakReport:
    """Start the stack, soak it for ``duration_s`` with faults, stop it; the report."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        stack = Stack(models, Path(tmp), workers=workers)
        try:
            stack.start()
            soak = Soak(stack, duration_s=duration_s, concurrency=concurrency, pause_s=pause_s,
                        seed=seed, sample_every_s=sample_every_s, log=log)
            report = asyncio.run(soak.run())
        finally:
            stack.stop()
        report.pids = list(stack.started)
        return report


def _percentiles(latencies: list[float]) -> str:
    if not latencies:
        return "| - | - |"
    p50, p99 = np.percentile(np.asarray(latencies) * 1000.0, [50, 99])
    return f"| {p50:.1f} | {p99:.1f} |"


def render(report: SoakReport) -> str:
    """The report as Markdown: phases, resources over time, violations."""
    lines = ["| phase | from-to (s) | requests | 200 | other statuses | X-Cache | p50 ms | "
             "p99 ms |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, start, end in report.phases:
        mine = [s for s in report.samples if s.phase == name]
        statuses = Counter(s.status for s in mine)
        others = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()) if k != 200) or "-"
        caches = Counter(s.cache for s in mine if s.status == 200)
        mix = ", ".join(f"{k} {v}" for k, v in caches.most_common())
        lines.append(f"| {name} | {start:.0f}-{end:.0f} | {len(mine)} | {statuses[200]} | "
                     f"{others} | {mix} {_percentiles([s.latency_s for s in mine])}")
    lines += ["", "| t (s) | phase | process | RSS MB | open fds |",
              "| --- | --- | --- | --- | --- |"]
    shown: list[ResourceSample] = []
    for process in ("gateway", "backend"):
        series = [r for r in report.resources if r.process == process and r.phase != "end"]
        shown += series[:: max(1, len(series) // 20)]
    shown.sort(key=lambda r: (r.t, r.process))
    shown += list(report.final.values())
    for r in shown:
        lines.append(f"| {r.t:.0f} | {r.phase} | {r.process} (pid {r.pid}) | {r.rss_mb:.0f} | "
                     f"{r.fds} |")
    lines.append("")
    lines.append(f"requests: {len(report.samples)}; answers verified against the backend: "
                 f"{report.verified}; failed policy reloads counted: {report.policy_failures:g}; "
                 f"duration {report.duration_s:.0f} s")
    for name in ("gateway", "backend"):
        warm, final = report.warm.get(name), report.final.get(name)
        if warm and final:
            lines.append(f"{name}: RSS {warm.rss_mb:.0f} -> {final.rss_mb:.0f} MB, fds "
                         f"{warm.fds} -> {final.fds} (warm -> end)")
    if report.ok:
        lines.append("violations: none")
    for kind, found in report.violations.items():
        if found:
            lines.append(f"violations ({kind}): {len(found)}; first: {found[:3]}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """``python -m bench soak``."""
    parser = argparse.ArgumentParser(prog="python -m bench soak")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop clients")
    parser.add_argument("--pause-ms", type=float, default=2.0, help="pause after each request")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = run(args.duration, models=args.models, workers=args.workers,
                 concurrency=args.concurrency, pause_s=args.pause_ms / 1000.0, seed=args.seed,
                 sample_every_s=max(1.0, args.duration / 120.0),
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    print(render(report))
    return 0 if report.ok else 1
