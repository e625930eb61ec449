"""Hit throughput of this checkout's gateway beside other checkouts' and the floor (wrk).

``python -m bench hitrps [--gateway-src DIR]... [--duration S] [--rounds R] [--connections C]
[--models DIR]``

The before/after companion of ``bench cpu``: each gateway (one worker, shipped settings, REST
upstream) answers the same cached ``/v1/embeddings`` request (a hot answer after the first),
and the floor (``bench.floor``: aiohttp + uvloop answering that same body and headers,
pre-encoded) runs in the same rounds. Servers share the first CPU, wrk gets the last; rounds
are interleaved and the median counts (``bench.gateway_throughput``). Req/s ratios from a run
where other processes held more than ~0.3 cores decide nothing: the table prints their CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from bench import gateway_throughput, services, wrk
from bench.gateway import HIT_BODY, JSON
from bench.gateway_probe import Probe, capture
from bench.gateway_throughput import Row
from bench.procs import split_cores


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hitrps")
    parser.add_argument("--gateway-src", type=Path, action="append", default=[],
                        help="another checkout whose gateway package runs beside this one")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per wrk run (8)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    if not wrk.available():
        print("bench hitrps: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    cores = split_cores()
    srcs: list[tuple[str, Path | None]] = [("this checkout", None)]
    srcs += [(str(src), src) for src in args.gateway_src]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        backend = stack.enter_context(services.backend(args.models, cores=cores.server))
        targets: list[gateway_throughput.Target] = []
        for name, src in srcs:
            gw = stack.enter_context(services.gateway(backend.url, cores=cores.server, src=src))
            probe = Probe.check(gw.url, HIT_BODY, "X-Cache", "HIT")  # sent twice: stored, hit
            if not probe.ok:
                print(f"bench hitrps: gateway ({name}): {probe.describe()}", file=sys.stderr)
                return 1
            targets.append((Row(f"gateway ({name}), hot hit"), gw, [HIT_BODY], "/v1/embeddings"))
        answer = Path(tmp) / "answer.json"
        capture(targets[0][1].url, HIT_BODY, answer)
        floor = stack.enter_context(services.floor(answer, cores=cores.server))
        targets.append((Row("aiohttp floor: the same answer and headers, pre-encoded"), floor,
                        [HIT_BODY], "/v1/embeddings"))
        gateway_throughput.measure(targets, headers=JSON, connections=args.connections,
                                   duration_s=args.duration, warmup_s=2.0, rounds=args.rounds,
                                   cores=cores.client)
    rows = [row for row, *_ in targets]
    print("\n".join(gateway_throughput.HEADER))
    for row in rows:
        print(row.markdown())
    floor_rps = rows[-1].rps
    print()
    for row in rows[:-1]:
        print(f"- {row.name}: {row.rps / max(floor_rps, 1e-9):.2f}x the floor's req/s")
    return 1 if any(row.errors for row in rows) else 0
