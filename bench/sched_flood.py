"""Tenant A's flood for ``python -m bench sched``: a closed loop on N connections, in its own
process (so it does not hold the interpreter lock of the open-loop generator that times B).

``python -m bench.sched_flood --url URL --tenant a --tag T --clients 64 --duration S --out F``

Each connection sends its next request as soon as the previous one is answered, whatever the
answer: a 503 with ``Retry-After`` is followed at once by the next request (A honours nothing:
that is a flood). Every request is a true miss (a unique short text, ``no-store``).

It prints ``started`` (stdout) just before the first request, and at the end writes to ``F``
one JSON object: ``{"stamp": <perf_counter just before the first request>, "cpu_s": <this
process's CPU seconds>, "wall_s": ..., "samples": [[index, sent_s, latency_s, status], ...]}``
(``sent_s`` from the stamp; ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for
every process, so the caller can place A's answers in its own measuring window).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench import loadgen
from bench.loadgen import LoadResult, Request


def flood(url: str, tenant: str, tag: str, clients: int, duration_s: float,
          timeout_s: float = 30.0) -> tuple[float, LoadResult]:
    """Runs the closed loop; (the perf_counter stamp taken just before it, its result)."""
    from bench.sched import headers, short  # bench.sched starts this module, never imports it

    json_h = {"Content-Type": "application/json", **headers(tenant)}

    def make(i: int) -> Request:
        return Request(url=url, body=short(tag, i), headers=json_h)

    stamp = time.perf_counter()
    result = loadgen.run(loadgen.run_closed(make, requests=10_000_000, concurrency=clients,
                                            max_duration_s=duration_s, timeout_s=timeout_s))
    return stamp, result


def encode(stamp: float, result: LoadResult, cpu_s: float) -> bytes:
    """The final output line (without its newline); ``sent_s`` counted from ``stamp``."""
    return orjson.dumps({"stamp": stamp, "cpu_s": cpu_s, "wall_s": result.wall_s,
                         "samples": [[s.index, s.sent_s, s.latency_s, s.status]
                                     for s in result.samples]})


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sched_flood",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--tenant", default="a")
    p.add_argument("--tag", default="flood")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--out", required=True, help="where the result goes (JSON)")
    a = p.parse_args(argv)
    if a.clients < 1 or a.duration <= 0:
        p.error("clients >= 1 and duration > 0 are required")
    cpu0 = time.process_time()
    sys.stdout.write("started\n")
    sys.stdout.flush()
    stamp, result = flood(a.url, a.tenant, a.tag, a.clients, a.duration)
    Path(a.out).write_bytes(encode(stamp, result, time.process_time() - cpu0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
