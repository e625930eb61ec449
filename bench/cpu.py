"""Instructions per request, counted by callgrind: a figure the machine's load cannot move.

``python -m bench cpu [--requests N] [--warmup N] [--cases a,b,...] [--gateway-src DIR]``

Each server runs alone under ``valgrind --tool=callgrind`` (the backend, where a case needs one,
runs outside it: its compute is the model's). After a warm-up the counters are zeroed
(``callgrind_control -z``), N requests go one at a time over one keep-alive connection, and the
counters are dumped (``callgrind_control -d``). Timers and background tasks (health checks,
metric flushes) run during that window too, so an idle window of the same length is counted
the same way and subtracted: what is left, divided by N, is the cost of one request.

Cases:
- ``floor_hit``: ``bench.floor`` (aiohttp + uvloop) answering a stored gateway hit, no work besides;
- ``hot``: the gateway answering a repeated body from its hot answer;
- ``l1_hit``: the gateway's full path answered by L1 (each body made unique by trailing
  whitespace, so it is never a hot answer);
- ``node_hit``: the same with ``cache.max_entries: 1``, so the node tier answers;
- ``proxy_miss``: ``bench.latency proxy`` (one pooled aiohttp ClientSession) before the backend;
- ``miss`` / ``miss_grpc``: the gateway, true misses (a new text per request) of
  ``/v1/embeddings`` over a REST / gRPC upstream, shipped settings;
- ``backend_floor``: ``bench.latency floor`` (floor (a): aiohttp + uvloop, the model called in
  one worker thread, batch 1), one short text per OIP infer request. It runs the model under
  callgrind too, so its figure leaves out what ONNX Runtime's own library executes (its
  instructions, summed per object file from the dump, are subtracted: compute is the model's;
  the tokenizer, the pooling and the C library calls ONNX Runtime makes stay in). Session
  options are the backend's (one thread, spinning off).
- ``backend``: our ``python -m backend serve`` (shipped settings, access log on, one ORT
  thread) answering the same requests, measured the same way. Its warm-up is set to batch 1
  at the floor's lengths (``BACKEND_WARMUP_BATCH_SIZES=1``): the shipped warm-up of the
  biggest batch at every length does not finish within 900 s under callgrind. Both backend
  cases print each object file's own instructions per request.

- ``refused``: the gateway refusing a tenant's request at once for its backlog (503
  ``queue_full``, judged early: before the policy, keys and lookups), what every request
  past the capacity costs under overload. A fake backend with one slot that never answers
  (``bench.slow_backend``), the gateway at one slot and one waiter per tier, the adaptive
  limit off and refusals not held (``admission.refusal_hold_s: 0``); one call holds the slot
  and one waits, then each counted request (a new text) is refused.

``--gateway-src`` runs another checkout's gateway package, ``--backend-src`` another checkout's
backend package (before/after figures in one run).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import orjson

from bench import services
from bench.procs import busy_seconds, clean_env, free_port

MODEL = "minilm"
CASES = ("floor_hit", "hot", "l1_hit", "node_hit", "proxy_miss", "miss", "miss_grpc",
         "refused", "backend_floor", "backend")
#: The object file whose own instructions ``backend_floor`` leaves out (ONNX Runtime's compute).
ORT_OBJECT = "onnxruntime_pybind11_state"


class Counted:
    """A server under callgrind: zero, dump and read its instruction counter."""

    def __init__(self, server: services.Server, outdir: Path) -> None:
        self.server = server
        self.outdir = outdir

    def _control(self, flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(self.server.service.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def zero(self) -> None:
        self._control("-z")

    def dump(self) -> int:
        """Instructions since the last zero (the newest dump's ``totals``)."""
        return totals(self.dump_file())

    def dump_file(self) -> Path:
        """Dump the counters since the last zero; the dump's path."""
        before = set(self.outdir.glob("cg.*"))
        self._control("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = sorted(set(self.outdir.glob("cg.*")) - before, key=lambda p: p.stat().st_mtime)
            for path in reversed(new):
                if _complete(path):
                    return path
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")


def _complete(path: Path) -> bool:
    try:
        return totals(path) >= 0
    except ValueError:
        return False


def totals(path: Path) -> int:
    """A dump's ``totals`` (or ``summary``); ``ValueError`` while it is still being written."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise ValueError(f"{path}: no totals yet")


def own_by_object(text: str) -> dict[str, int]:
    """Each object file's own (exclusive) instructions in a callgrind dump (the first event).

    A cost line after ``calls=`` is the call's inclusive cost, charged to the callee's own
    lines elsewhere, so it is skipped; ``ob=`` names the object of the functions that follow,
    with callgrind's name compression (``ob=(3) /path`` once, ``ob=(3)`` after; ``cob=`` shares
    the numbering).
    """
    names: dict[str, str] = {}
    own: dict[str, int] = {}
    current = "?"
    after_call = False

    def name_of(spec: str) -> str:
        spec = spec.strip()
        if spec.startswith("("):
            ident, _, rest = spec.partition(")")
            rest = rest.strip()
            if rest:
                names[ident] = rest
            return names.get(ident, spec)
        return spec

    for line in text.splitlines():
        if not line:
            continue
        head = line[0]
        if head.isdigit() or head in "+-*":
            parts = line.split()
            if after_call:
                after_call = False
                continue
            if len(parts) >= 2:
                own[current] = own.get(current, 0) + int(parts[1])
        elif line.startswith("ob="):
            current = name_of(line[3:])
        elif line.startswith("cob="):
            name_of(line[4:])
        elif line.startswith("calls="):
            after_call = True
    return own


def valgrind(outdir: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={outdir}/cg.%p",
            "--dump-instr=no", "--collect-jumps=no"]


class Client:
    """One keep-alive HTTP/1.1 connection, one request at a time (outside valgrind)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None,
             ) -> tuple[int, dict[str, str], bytes]:
        self.conn.request("POST", path, body=body,
                          headers={"Content-Type": "application/json", **(headers or {})})
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def get(self, path: str) -> bytes:
        self.conn.request("GET", path)
        return self.conn.getresponse().read()

    def close(self) -> None:
        self.conn.close()


def embeddings_body(text: str, pad: int = 0) -> bytes:
    return orjson.dumps({"model": MODEL, "input": text}) + b" " * pad


def measure(counted: Counted, client: Client, send: Callable[[int], None], *, warmup: int,
            requests: int, leave_out: str | None = None,
            objects: dict[str, float] | None = None) -> float:
    """Instructions per request, the idle window's rate subtracted; ``leave_out``: the own
    instructions of object files whose path holds it are not counted; ``objects``, when given,
    receives each object file's own instructions per request (the busy window's, idle time
    not subtracted)."""
    for i in range(warmup):
        send(i)
    counted.zero()
    t0 = time.monotonic()
    for i in range(warmup, warmup + requests):
        send(i)
    path = counted.dump_file()
    elapsed = time.monotonic() - t0
    busy = totals(path)
    if leave_out is not None or objects is not None:
        own = own_by_object(path.read_text(errors="replace"))
        if leave_out is not None:
            busy -= sum(ir for ob, ir in own.items() if leave_out in ob)
        if objects is not None:
            for ob, ir in own.items():
                name = Path(ob).name.split(".")[0] or ob
                objects[name] = objects.get(name, 0.0) + ir / requests
    counted.zero()
    time.sleep(min(elapsed, 30.0))
    idle = counted.dump() / min(elapsed, 30.0)
    return (busy - idle * elapsed) / requests


def expect(status: int, headers: dict[str, str], cache: str | None) -> None:
    if status != 200:
        raise RuntimeError(f"answer {status}")
    if cache is not None and headers.get("x-cache") != cache:
        raise RuntimeError(f"expected X-Cache {cache}, got {headers.get('x-cache')}")


@contextlib.contextmanager
def under_callgrind(start: Callable[[list[str]], services.Server]) -> Iterator[Counted]:
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as out:
        server = start(valgrind(Path(out)))
        try:
            yield Counted(server, Path(out))
        finally:
            server.stop()


def gateway_case(case: str, backend: services.Server, src: Path | None, warmup: int,
                 requests: int) -> float:
    settings: dict[str, object] = {}
    if case == "node_hit":
        settings["cache.max_entries"] = 1
    url = backend.url if case != "miss_grpc" else f"grpc://127.0.0.1:{backend.grpc_port}"

    def start(prefix: list[str]) -> services.Server:
        return services.gateway(url, cores=None, settings=settings, src=src, prefix=prefix,
                                ready_timeout_s=600.0)

    with under_callgrind(start) as counted:
        client = Client(counted.server.port)
        try:
            if case in ("l1_hit", "node_hit", "hot"):
                texts = [f"a warm sentence number {i}" for i in range(8)]
                for t in texts:  # store them (MISS), then they answer from the cache
                    expect(*client.post("/v1/embeddings", embeddings_body(t))[:2], None)

            def send(i: int) -> None:
                if case == "hot":
                    s, h, _ = client.post("/v1/embeddings", embeddings_body("a warm sentence "
                                                                              "number 0"))
                    expect(s, h, "HIT")
                elif case in ("l1_hit", "node_hit"):
                    # A body never sent before (never hot), a text the cache holds.
                    s, h, _ = client.post("/v1/embeddings",
                                          embeddings_body(f"a warm sentence number {i % 8}",
                                                          pad=i + 1))
                    expect(s, h, "HIT")
                else:
                    s, h, _ = client.post("/v1/embeddings",
                                          embeddings_body(f"a new sentence {i} to embed"))
                    expect(s, h, "MISS")

            return measure(counted, client, send, warmup=warmup, requests=requests)
        finally:
            client.close()



#: ``refused``: what the held calls ask for (the cap the gateway is given) and the gateway's
#: settings that make every later call of the tenant a refusal judged early.
_HOLD_MS = 3_600_000
REFUSED_SETTINGS: dict[str, object] = {
    "admission.tier_concurrency": 1, "admission.tier_queue": 1,
    "admission.adaptive.enabled": False, "admission.refusal_hold_s": 0,
    "admission.max_wait_factor": 0, "max_timeout_ms": _HOLD_MS,
    "routing.num_retries": 0,
}


def hold_calls(client: Client, port: int, wait_s: float = 600.0,
               ) -> list[http.client.HTTPConnection]:
    """The ``refused`` case's two held calls to the gateway on ``port`` (its settings:
    ``REFUSED_SETTINGS``, a backend that never answers): one in the only slot, one queued
    behind it. Returns their connections (closing them ends the calls) once ``client`` reads
    the second one queued in the gateway's metrics (``wait_s`` at most: under callgrind a
    scrape is slow)."""
    held: list[http.client.HTTPConnection] = []
    for i in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/embeddings", body=embeddings_body(f"held call {i}"),
                     headers={"Content-Type": "application/json",
                              "X-Request-Timeout-Ms": str(_HOLD_MS)})
        held.append(conn)
    give_up = time.monotonic() + wait_s
    while time.monotonic() < give_up:
        if re.search(rb'gateway_queue_depth\{class="interactive",tier="[^"]+"\} 1\.0',
                     client.get("/metrics")):
            return held
        time.sleep(0.05)
    for conn in held:
        conn.close()
    raise RuntimeError("the second held call never queued")


def refused_case(src: Path | None, warmup: int, requests: int) -> float:
    """Instructions per request refused at once (the ``refused`` case, module docstring)."""
    with services.slow_backend(cores=None, slots=1, service_ms=_HOLD_MS) as backend:

        def start(prefix: list[str]) -> services.Server:
            return services.gateway(backend.url, cores=None, settings=REFUSED_SETTINGS,
                                    src=src, prefix=prefix, ready_timeout_s=600.0)

        with under_callgrind(start) as counted:
            client = Client(counted.server.port)
            held = hold_calls(client, counted.server.port)

            def send(i: int) -> None:
                s, _, body = client.post("/v1/embeddings",
                                         embeddings_body(f"a refused sentence {i}"))
                if s != 503 or b"queue" not in body:
                    raise RuntimeError(f"expected a 503 for the full queue, got {s}: "
                                       f"{body[:200]!r}")

            try:
                return measure(counted, client, send, warmup=warmup, requests=requests)
            finally:
                client.close()
                for conn in held:
                    conn.close()


def floor_case(backend: services.Server, warmup: int, requests: int) -> float:
    # The floor answers what the gateway answers for a hit: take one from a plain gateway.
    with services.gateway(backend.url, cores=None) as gw:
        c = Client(gw.port)
        c.post("/v1/embeddings", embeddings_body("a warm sentence number 0"))
        status, headers, body = c.post("/v1/embeddings", embeddings_body("a warm sentence "
                                                                         "number 0"))
        c.close()
        expect(status, headers, "HIT")
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as f:
        f.write(orjson.dumps({"body": body.decode(), "headers": headers}))
        answer = Path(f.name)
    try:
        def start(prefix: list[str]) -> services.Server:
            return services.floor(answer, cores=None, prefix=prefix, ready_timeout_s=600.0)

        with under_callgrind(start) as counted:
            client = Client(counted.server.port)

            def send(i: int) -> None:
                expect(*client.post("/v1/embeddings", embeddings_body("x"))[:2], None)

            try:
                return measure(counted, client, send, warmup=warmup, requests=requests)
            finally:
                client.close()
    finally:
        answer.unlink()


def proxy_case(backend: services.Server, warmup: int, requests: int) -> float:
    def start(prefix: list[str]) -> services.Server:
        port = free_port()
        argv = [*prefix, sys.executable, "-m", "bench.latency", "proxy", "--port", str(port),
                "--upstream", backend.url]
        return services.started(services.Service("proxy", argv), port, "/v2/health/ready", 600.0)

    with under_callgrind(start) as counted:
        client = Client(counted.server.port)

        def send(i: int) -> None:
            expect(*client.post(f"/v2/models/{MODEL}/infer", _infer_body(i))[:2], None)

        try:
            return measure(counted, client, send, warmup=warmup, requests=requests)
        finally:
            client.close()


def _infer_body(i: int) -> bytes:
    return orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "data": [f"a new sentence {i} to embed"]}]})


def backend_case(case: str, models: Path, warmup: int, requests: int,
                 objects: dict[str, float] | None = None, src: Path | None = None) -> float:
    """A model server under callgrind, ONNX Runtime's own instructions left out (one text per
    request, a new one each time, one request at a time). ``backend_floor``: floor (a);
    ``backend``: ``python -m backend serve`` with its shipped settings but a warm-up of batch 1
    only (the floor's: a warm-up of the biggest batch at every length takes hours under
    callgrind, and the case never sends more than one text). ``src``: run the backend package
    of another checkout (``git archive <commit> backend | tar -x -C DIR``)."""
    def start(prefix: list[str]) -> services.Server:
        port = free_port()
        if case == "backend_floor":
            argv = [*prefix, sys.executable, "-m", "bench.latency", "floor", "--port", str(port),
                    "--models", str(models), "--threads", "1"]
            env = None
        else:
            argv = [*prefix, sys.executable, "-m", "backend", "serve", "--models",
                    str(models.resolve()),
                    "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
                    "--device", "cpu"]  # shipped logging: the access log on
            env = clean_env(BACKEND_WARMUP_BATCH_SIZES="1", BACKEND_WARMUP_LENGTHS="8,64,256")
        service = services.Service(case, argv, env=env, cwd=str(src) if src else None)
        return services.started(service, port, "/v2/health/ready", 900.0)

    with under_callgrind(start) as counted:
        client = Client(counted.server.port)

        def send(i: int) -> None:
            status, _, body = client.post(f"/v2/models/{MODEL}/infer", _infer_body(i))
            if status != 200 or b'"embedding"' not in body:
                raise RuntimeError(f"answer {status}")

        try:
            return measure(counted, client, send, warmup=warmup, requests=requests,
                           leave_out=ORT_OBJECT, objects=objects)
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu", description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--gateway-src", type=Path, action="append", default=[],
                        help="also run the gateway cases from this checkout (repeatable)")
    parser.add_argument("--backend-src", type=Path, action="append", default=[],
                        help="also run the backend case from this checkout (repeatable)")
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases: {', '.join(sorted(unknown))} (have: {', '.join(CASES)})")
    busy0, t0 = busy_seconds(), time.monotonic()
    rows: list[tuple[str, str, float]] = []
    breakdown: dict[str, dict[str, float]] = {}
    with services.backend(args.models, cores=None, grpc=True) as backend:
        for case in cases:
            if case == "floor_hit":
                rows.append((case, "floor", floor_case(backend, args.warmup, args.requests)))
            elif case == "proxy_miss":
                rows.append((case, "floor", proxy_case(backend, args.warmup, args.requests)))
            elif case == "refused":
                for src in [None, *args.gateway_src]:
                    label = "this checkout" if src is None else str(src)
                    rows.append((case, label, refused_case(src, args.warmup, args.requests)))
            elif case == "backend_floor":
                objects = breakdown.setdefault(case, {})
                rows.append((case, "floor", backend_case(case, args.models, args.warmup,
                                                         args.requests, objects)))
            elif case == "backend":
                for src in [None, *args.backend_src]:
                    label = "this checkout" if src is None else str(src)
                    objects = breakdown.setdefault(f"{case} ({label})", {})
                    rows.append((case, label, backend_case(
                        case, args.models, args.warmup, args.requests, objects,
                        src.resolve() if src else None)))
            else:
                for src in [None, *args.gateway_src]:
                    label = "this checkout" if src is None else str(src)
                    rows.append((case, label,
                                 gateway_case(case, backend, src, args.warmup, args.requests)))
    wall = time.monotonic() - t0
    print(f"requests per case: {args.requests} (after {args.warmup} warm-up); instructions "
          "counted by callgrind, an idle window's rate subtracted\n")
    print("| case | server | k instructions / request |")
    print("| --- | --- | ---: |")
    for case, label, ir in rows:
        print(f"| {case} | {label} | {ir / 1000:.0f} |")
    floor = {c: ir for c, _, ir in rows if c in ("floor_hit", "proxy_miss")}
    print()
    for case, label, ir in rows:
        base = floor.get("floor_hit") if case in ("hot", "l1_hit", "node_hit", "refused") else (
            floor.get("proxy_miss") if case.startswith("miss") else None)
        if base:
            print(f"- {case} ({label}): {ir / base:.2f}x its floor")
    backend_floor = next((ir for c, _, ir in rows if c == "backend_floor"), None)
    for case, label, ir in rows:
        if case == "backend" and backend_floor:
            print(f"- backend ({label}): {ir / backend_floor:.2f}x floor (a), "
                  f"{(ir - backend_floor) / 1000:+.0f}k per request")
    for case, objects in breakdown.items():
        top = sorted(objects.items(), key=lambda kv: -kv[1])[:10]
        print(f"\n{case}, own instructions per request by object file (k, busy window): "
              + ", ".join(f"{name} {ir / 1000:.0f}" for name, ir in top))
    other = max(0.0, (busy_seconds() - busy0) / wall)
    print(f"\nCPU busy on the machine during the run: {other:.2f} cores (instruction counts do "
          "not depend on it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
