"""``python -m bench fuzz`` (``make fuzz``): schemathesis' own runner against both services.

A real backend (the real model) and a real gateway in front of it with a real Redis (so the batch
routes work), loopback ports, stopped by PID. The gateway runs without an admin token, so it
serves its document without the ``/admin`` routes (they are 404 then); ``--engine own`` runs the
project's older engine (``bench/fuzz.py``), which covers them with a token.

Each service gets ``st run`` on its served ``/openapi.json`` with every check (``--checks all``:
server errors, status codes, content types, headers, response schemas, negative data refused,
positive data accepted, missing required headers, unsupported methods, auth, use-after-free,
resource availability), every phase (examples, coverage, fuzzing, stateful), a pinned seed per
service and ``bench/schemathesis.toml`` (the exceptions a schema cannot express, each with its
reason). The verdict is schemathesis' exit status; the case count is the one it reports.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bench" / "schemathesis.toml"
PHASES = "examples,coverage,fuzzing,stateful"
SEEDS = {"gateway": 20261204, "backend": 20261205}
"""Pinned: the same cases every run, so 0 failures stays 0 and a new one is a regression."""
_GENERATED = re.compile(r"(\d+) generated")


@dataclass(frozen=True, slots=True)
class StRun:
    """One service's ``st run``: exit status, cases generated, seed, and where the log is."""

    service: str
    code: int
    cases: int
    seed: int
    log: Path

    def row(self) -> str:
        verdict = "0 failures" if self.code == 0 else f"FAILED (exit {self.code})"
        return f"| {self.service} | {self.seed} | {self.cases} | {verdict} | {self.log} |"


def st_command(url: str, *, seed: int, examples: int, max_time_s: float | None) -> list[str]:
    """The ``st run`` argv for one service."""
    st = Path(sys.executable).with_name("st")
    argv = [str(st), "--config-file", str(CONFIG), "run", url.rstrip("/") + "/openapi.json",
            "--checks", "all", "--phases", PHASES, "--seed", str(seed),
            "--max-examples", str(examples), "--no-color", "--continue-on-failure"]
    if max_time_s is not None:
        argv += ["--max-time", str(int(max_time_s))]
    return argv


def run_st(service: str, url: str, *, seed: int, examples: int, out: Path,
           max_time_s: float | None = None) -> StRun:
    """Run ``st run`` for one service, its output in ``out/<service>.txt``."""
    log = out / f"{service}.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the hooks module: bench.fuzz_hooks
    with log.open("w", encoding="utf-8") as sink:
        code = subprocess.call(st_command(url, seed=seed, examples=examples,
                                          max_time_s=max_time_s),
                               stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    found = _GENERATED.findall(log.read_text(encoding="utf-8", errors="replace"))
    return StRun(service, code, int(found[-1]) if found else 0, seed, log)


def main(argv: Sequence[str]) -> int:
    """Both services, one after the other; 0 when schemathesis found nothing."""
    parser = argparse.ArgumentParser(prog="python -m bench fuzz")
    parser.add_argument("--examples", type=int, default=100,
                        help="max examples per operation and phase (schemathesis -n)")
    parser.add_argument("--seed", type=int, default=None,
                        help="one seed for both services (default: the pinned ones)")
    parser.add_argument("--minutes", type=float, default=None, help="time cap per service")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--only", choices=("gateway", "backend"), default=None)
    parser.add_argument("--out", type=Path, default=None, help="where the logs go")
    args = parser.parse_args(argv)
    from bench import services as svc

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    runs: list[StRun] = []
    with svc.redis(cores=None) as redis, svc.backend(args.models, cores=None) as backend, \
            svc.gateway(backend.url, cores=None, redis_url=svc.redis_url(redis),
                        settings={"logging": {"level": "WARNING"}}, name="fuzz-gateway") as gw:
        for service, url in (("gateway", gw.url), ("backend", backend.url)):
            if args.only not in (None, service):
                continue
            seed = SEEDS[service] if args.seed is None else args.seed
            print(f"st run {service} at {url}: seed {seed}, -n {args.examples}",
                  file=sys.stderr, flush=True)
            runs.append(run_st(service, url, seed=seed, examples=args.examples, out=out,
                               max_time_s=args.minutes * 60 if args.minutes else None))
    print("| service | seed | cases | result | log |")
    print("| --- | --- | --- | --- | --- |")
    for run in runs:
        print(run.row())
    return 0 if all(run.code == 0 for run in runs) else 1
