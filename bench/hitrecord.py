"""A trace recorded from the gateway itself, for ``bench hitratio --trace`` (issue 27).

Run: ``python -m bench hitrecord [--out FILE] [--requests N] [--texts N] [--alpha A]
[--scan F] [--seconds S] [--concurrency C]``. Starts the real backend (the built model) and a
gateway of one worker with the trace recorder on (``cache.trace``), sends ``requests``
embedding requests on loopback (``/v1/embeddings``, closed loop): texts drawn by Zipf
popularity ``alpha`` from ``texts`` distinct ones (seeded: every run sends the same sequence),
one-off texts (never repeated) making up ``scan`` of them in bursts, and one request in
``LIST_EVERY`` a list of ``LIST_TEXTS`` texts (one lookup per text, as the gateway counts them).
The run stops at ``requests`` or ``seconds``, whichever comes first; the gateway is stopped
(its shutdown writes what the recorder queued) and its trace file copied to ``--out``.

Then: ``python -m bench hitratio --trace FILE``. The texts are made up here; the file holds only
hashes, times and sizes, like any recorded trace.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import orjson

from bench import hittraces, services
from bench.loadgen import Request, run_closed
from bench.procs import split_cores
from gateway.cache.tracefile import read_trace

LIST_EVERY = 10
LIST_TEXTS = 4
SEED = 2727


def texts_for(requests: int, texts: int, alpha: float, scan: float,
              seed: int = SEED) -> list[list[int]]:
    """Key ids per request (a one-item list, or ``LIST_TEXTS`` for every ``LIST_EVERY``-th):
    Zipf over ``texts`` ids, one-off ids from ``texts`` up replacing ``scan`` of them."""
    per_request = [LIST_TEXTS if i % LIST_EVERY == LIST_EVERY - 1 else 1
                   for i in range(requests)]
    lookups = sum(per_request)
    keys = hittraces.zipf(alpha, n=lookups, universe=texts, seed=seed)
    if scan > 0:
        keys = hittraces.with_scans(keys, scan, first_key=texts, seed=seed)
    out: list[list[int]] = []
    at = 0
    for n in per_request:
        out.append(keys[at:at + n].tolist())
        at += n
    return out


def text(key: int) -> str:
    """A made-up sentence per key id (distinct ids, distinct texts)."""
    words = ("cache", "trace", "edge", "gateway", "vector", "query", "answer", "tenant")
    rng = np.random.default_rng(key)
    tail = " ".join(words[i] for i in rng.integers(0, len(words), size=6))
    return f"sample {key}: {tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hitrecord",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gateway-trace.bin"))
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--texts", type=int, default=5_000, help="distinct repeated texts")
    parser.add_argument("--alpha", type=float, default=0.8, help="Zipf exponent")
    parser.add_argument("--scan", type=float, default=0.1, help="fraction of one-off texts")
    parser.add_argument("--seconds", type=float, default=300.0, help="time bound of the load")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    if args.requests < 1 or args.texts < 1 or not 0 <= args.scan < 1 or args.seconds <= 0:
        parser.error("--requests and --texts must be >= 1, --scan in [0, 1), --seconds > 0")
    plan = texts_for(args.requests, args.texts, args.alpha, args.scan)
    bodies = [orjson.dumps({"model": "minilm",
                            "input": text(ids[0]) if len(ids) == 1 else [text(k) for k in ids]})
              for ids in plan]
    cores = split_cores()
    with ExitStack() as stack:
        backend = stack.enter_context(services.backend(args.models, cores=cores.server))
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hitrecord-")))
        base /= "trace.bin"
        gw = services.gateway(backend.url, cores=cores.server, settings={
            "cache.trace": {"enabled": True, "path": str(base), "max_seconds": args.seconds + 60,
                            "max_bytes": 256 * 1024 * 1024}})
        stack.callback(gw.stop)
        url = gw.url + "/v1/embeddings"
        headers = {"Content-Type": "application/json"}
        t0 = time.monotonic()
        result = asyncio.run(run_closed(
            lambda i: Request(url=url, body=bodies[i], headers=headers),
            requests=len(bodies), concurrency=args.concurrency, max_duration_s=args.seconds))
        wall = time.monotonic() - t0
        gw.service.stop()  # SIGTERM: the app's cleanup writes what the recorder queued
        files = sorted(glob.glob(f"{base}.*"))
        if len(files) != 1:
            print(f"hitrecord: expected one trace file, found {files}", file=sys.stderr)
            return 1
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[0], args.out)
    records = read_trace(str(args.out))
    sent = len(result.samples)
    print(f"sent {sent} requests in {wall:.0f} s ({result.stopped_by} bound), statuses "
          f"{result.status_counts()}; trace {args.out}: {len(records)} lookups over "
          f"{len({r.key for r in records})} keys, {args.out.stat().st_size} bytes")
    if result.ok and len(result.ok) < sent:
        print("hitrecord: some requests failed (above)", file=sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
