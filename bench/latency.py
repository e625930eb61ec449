"""Miss latency against the plainest possible stack: floors and our servers, in one run.

``python -m bench latency [--rounds R] [--requests N] [--concurrency 1,32] [--threads T]
[--access-log on|off] [--backend-src DIR] [--gateway-src DIR] [--quick]``

Every path answers the same OIP infer request for one text (a short sentence, and a ~200-token
paragraph) with the same session: the model as ``load_models`` loads it for ``serve`` (same
options, same intra-op threads), on CPU. Paths:

- floor (a): a bare aiohttp + uvloop server written for this bench (``python -m bench.latency
  floor``): reads the JSON body, hands the text to one worker thread that tokenizes, pads and
  runs it at batch 1 (``EmbeddingModel.embed``, as the backend's worker does), answers JSON.
- backend REST: ``python -m backend serve``, the same JSON request to ``/v2/.../infer``.
- backend gRPC: the same server's ``inference.GRPCInferenceService/ModelInfer`` from a
  ``grpc.aio`` client, the text in ``raw_input_contents`` (as tritonclient sends it).
- floor (b): a bare aiohttp + uvloop proxy written for this bench (``python -m bench.latency
  proxy``) with one pooled keep-alive ``ClientSession``, in front of (a): the body in, the
  answer (and its Server-Timing) back.
- the gateway on a miss (``python -m gateway serve``, one worker, settings as shipped, every
  request ``Cache-Control: no-cache``: lookup, backend call, store, each answer checked to be a
  MISS; each request's text a case variant of its own, the same tokens under a key of its own,
  so concurrent misses are not coalesced) in front of our backend, over REST (``http://``) and
  over gRPC (``grpc://``, the backend's gRPC port): on the OIP route (the same request and
  answer as every row above) and on ``/v1/embeddings`` (the same text; binary outputs from the
  backend, OpenAI JSON out).

Method: servers on the first usable CPU, the client on the last (``bench.procs.split_cores``,
as the other benches pin); rounds interleaved: each round runs every (concurrency, text, path)
cell, paths in a rotating order, so drift on a shared machine hits every path alike.
Closed loop: ``c`` clients, each sending its next request when the last is answered. Each
answer's own timing (``Server-Timing`` / ``server-timing`` trailing metadata: queue + compute)
is kept beside the client's latency, so the report can also give the time *outside* the model,
which does not move with compute jitter.

``--backend-src DIR`` runs the backend from another checkout (``git archive <commit> backend |
tar -x -C DIR``), for before/after tables in one run; without ``--grpc-port`` there, the gRPC
rows are left empty. ``--gateway-src DIR`` (``git archive <commit> gateway | tar -x -C DIR``)
adds the gateway rows over REST of that checkout's gateway beside this one's.

Targets (issue 16), at 1 connection, both texts: backend REST p50 <= floor (a) p50 + 0.3 ms;
gateway miss p50 - backend direct (REST) p50 <= (floor (b) p50 - floor (a) p50) + 0.3 ms, for
each upstream protocol and route.
The report also says how many cores other processes held while it measured (the machine's
busy time less the servers' and this process's): above 0.3 cores a run is marked as not
deciding. Exit code 1 when a request failed or a server would not start; a missed target is
reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import orjson
from aiohttp import web

from bench import loadgen, services
from bench.procs import Cores, Meter, Service, free_port, pinned, split_cores

MODEL = "minilm"
SHORT = "How do I reset my password?"
LONG = (  # ~200 tokens of ordinary prose ([CLS] and [SEP] included; the report says how many)
    "Our quarterly report shows that revenue grew by twelve percent compared with the same "
    "period last year, driven mostly by strong demand in the European market and by the new "
    "subscription plans that we introduced in the spring. Operating costs rose more slowly "
    "than revenue, because the migration of our data centres to a single cloud provider was "
    "finished ahead of schedule and the savings from it started to show in the second month "
    "of the quarter. Customer support answered more requests than ever before, yet the "
    "average time to a first reply fell from nine hours to just under four, thanks to the "
    "new routing rules and the help articles that now answer the most common questions about "
    "billing, passwords and delivery times. For the next quarter we expect slower growth, as "
    "the summer months are usually quiet, and we plan to hire eight engineers for the "
    "platform team. The board has approved the budget for a second office in Lisbon, which "
    "should open in the autumn and will host the support and the sales teams for southern "
    "Europe."
)
TEXTS = {"short": SHORT, "~200 tokens": LONG}
TARGET_MS = 0.3
QUIET_CORES = 0.3  # other processes above this: the run decides nothing
SERVICE = "/inference.GRPCInferenceService/ModelInfer"
FLOOR_B = "floor (b): bare aiohttp proxy (one pooled ClientSession) -> (a)"


@dataclass(frozen=True)
class Plan:
    """What one run does, from the command line."""

    models: Path
    rounds: int
    requests: int  # per cell and round at 1 connection; x concurrency/2 at more (min 2 each)
    concurrency: tuple[int, ...]
    threads: int
    access_log: bool
    cores: Cores
    backend_src: Path | None  # another checkout's backend (REST only), for before/after
    gateway_src: Path | None = None  # another checkout's gateway, rows beside this one's


def parse(argv: Sequence[str]) -> Plan:
    """The run's plan from ``argv``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m bench latency",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=150,
                        help="short-text requests per cell and round at 1 connection (150; "
                        "a third for the long text, x connections / 8 at more)")
    parser.add_argument("--concurrency", default="1,32", help="connections, comma-separated")
    parser.add_argument("--threads", type=int, help="ORT threads (default: server-side cores)")
    parser.add_argument("--access-log", choices=["on", "off"], default="on",
                        help="the backend's access log (on: as deployed)")
    parser.add_argument("--backend-src", type=Path,
                        help="run the backend from this folder (another checkout; REST only)")
    parser.add_argument("--gateway-src", type=Path,
                        help="also run the gateway from this folder (another checkout; REST "
                        "upstream), for before/after rows")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    args = parser.parse_args(argv)
    concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    if args.rounds < 1 or args.requests < 1 or not concurrency or min(concurrency) < 1:
        parser.error("--rounds, --requests and every --concurrency must be >= 1")
    cores = split_cores()
    return Plan(
        models=args.models,
        rounds=2 if args.quick else args.rounds,
        requests=min(args.requests, 20) if args.quick else args.requests,
        concurrency=concurrency,
        threads=args.threads or len(cores.server),
        access_log=args.access_log == "on",
        cores=cores,
        backend_src=args.backend_src.resolve() if args.backend_src else None,
        gateway_src=args.gateway_src.resolve() if args.gateway_src else None,
    )


# --- the floor server ----------------------------------------------------------------------


def floor_main(argv: Sequence[str]) -> int:
    """``python -m bench.latency floor --port P --models M --threads T``: floor (a)."""
    parser = argparse.ArgumentParser(prog="python -m bench.latency floor")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import uvloop

    from backend.model import load_models
    from backend.settings import ServeSettings

    settings = ServeSettings.from_env(models_dir=args.models, threads=args.threads,
                                      device="cpu")
    model = next(m for m in load_models(settings) if m.name == MODEL)
    model.warm_up((8, 64, 256), (1,))
    worker = ThreadPoolExecutor(1)

    async def infer(request: web.Request) -> web.Response:
        text = orjson.loads(await request.read())["inputs"][0]["data"][0]
        started = time.perf_counter()
        ((row, _),) = await asyncio.get_running_loop().run_in_executor(
            worker, model.embed, [text])
        compute_ms = (time.perf_counter() - started) * 1000
        body = orjson.dumps({"model_name": MODEL, "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": [1, len(row)], "data": row}]},
            option=orjson.OPT_SERIALIZE_NUMPY)
        return web.Response(body=body, content_type="application/json",
                            headers={"Server-Timing": f"compute;dur={compute_ms:.3f}"})

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ready")

    app = web.Application()
    app.router.add_post(f"/v2/models/{MODEL}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=args.port, loop=uvloop.new_event_loop(),
                print=None, access_log=None)
    return 0


def proxy_main(argv: Sequence[str]) -> int:
    """``python -m bench.latency proxy --port P --upstream URL``: floor (b), the plainest
    proxy: one pooled keep-alive ClientSession, the body passed on, the answer passed back."""
    parser = argparse.ArgumentParser(prog="python -m bench.latency proxy")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    import uvloop

    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session(app: web.Application) -> Any:
        app[session_key] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=60.0),
            auto_decompress=False)
        yield
        await app[session_key].close()

    async def proxy(request: web.Request) -> web.Response:
        body = await request.read()
        async with request.app[session_key].post(
                args.upstream + request.path, data=body,
                headers={"Content-Type": "application/json"}) as answer:
            data = await answer.read()
            timing = answer.headers.get("Server-Timing", "")
            return web.Response(body=data, status=answer.status,
                                content_type=answer.content_type,
                                headers={"Server-Timing": timing} if timing else None)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ready")

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_post(f"/v2/models/{MODEL}/infer", proxy)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=args.port, loop=uvloop.new_event_loop(),
                print=None, access_log=None)
    return 0


# --- the client ----------------------------------------------------------------------------


@dataclass
class Cell:
    """One path x text x concurrency: every sample over every round."""

    latency_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)  # the answer's own queue + compute
    wall_s: float = 0.0
    errors: int = 0
    loop_cpu_s: float = 0.0  # the server's main thread (event loop) over the cell's runs
    other_cpu_s: float = 0.0  # its other threads (inference worker, ORT, grpcio)

    def p(self, q: float) -> float:
        return loadgen.percentile(self.latency_ms, q)

    @property
    def outside_p50(self) -> float:
        """Median of (latency - the server's own queue + compute), per request."""
        values = [t - s for t, s in zip(self.latency_ms, self.server_ms, strict=True)]
        return statistics.median(values) if values else math.nan

    @property
    def rate(self) -> float:
        return len(self.latency_ms) / self.wall_s if self.wall_s > 0 else math.nan

    def cpu_us(self, seconds: float) -> float:
        """CPU microseconds per answered request."""
        return seconds / len(self.latency_ms) * 1e6 if self.latency_ms else math.nan


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds ``pid`` has run (``schedstat``, nanoseconds: not skewed by others taking
    the CPU away): its main thread, and every other thread together."""
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
            if task.name == str(pid):
                main += seconds
            else:
                others += seconds
    return main, others


# One request: returns (latency ms, server-reported ms); raises on failure.
Send = Callable[[str], Awaitable[tuple[float, float]]]


@dataclass(frozen=True)
class PathSpec:
    """A path under test: its row label, how to build its sender, whose CPU it spends."""

    name: str
    sender: Callable[[Endpoints, int], contextlib.AbstractAsyncContextManager[Send]]
    server: str  # "floor" or "backend": the process whose CPU each request costs


@dataclass(frozen=True)
class Endpoints:
    floor_url: str
    backend_url: str
    backend_grpc: str
    pids: dict[str, int]
    proxy_url: str = ""  # floor (b)
    gateway_urls: dict[str, str] = field(default_factory=dict)  # by upstream: rest, grpc


def server_ms(timing: str) -> float:
    """Sum of the ``queue`` and ``compute`` ``dur`` values of a Server-Timing value (the
    gateway's also names its own stages and a total, which are not the model's time)."""
    total = 0.0
    for part in timing.split(","):
        name, _, dur = part.partition(";dur=")
        if name.strip() in ("queue", "compute"):
            with contextlib.suppress(ValueError):
                total += float(dur)
    return total


def rest_body(text: str) -> bytes:
    return orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "data": [text]}]})


@contextlib.asynccontextmanager
async def _rest(url: str, pool: int) -> Any:
    bodies = {text: rest_body(text) for text in TEXTS.values()}
    headers = {"Content-Type": "application/json"}
    async with loadgen.client_session(pool=pool) as http:
        async def send(text: str) -> tuple[float, float]:
            started = time.perf_counter()
            async with http.post(url, data=bodies[text], headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
                elapsed = (time.perf_counter() - started) * 1000
                return elapsed, server_ms(response.headers.get("Server-Timing", ""))

        yield send


@contextlib.asynccontextmanager
async def _grpc(address: str, pool: int) -> Any:
    from oip import inference_pb2 as pb

    requests = {}
    for text in TEXTS.values():
        message = pb.ModelInferRequest(model_name=MODEL)
        message.inputs.add(name="text", datatype="BYTES", shape=[1])
        raw = text.encode()
        message.raw_input_contents.append(len(raw).to_bytes(4, "little") + raw)
        requests[text] = message.SerializeToString()
    async with grpc.aio.insecure_channel(address) as channel:
        call: Any = channel.unary_unary(SERVICE, request_serializer=None,
                                   response_deserializer=pb.ModelInferResponse.FromString)

        async def send(text: str) -> tuple[float, float]:
            started = time.perf_counter()
            rpc = call(requests[text], timeout=60)
            await rpc
            elapsed = (time.perf_counter() - started) * 1000
            trailing = dict(await rpc.trailing_metadata() or ())
            return elapsed, server_ms(str(trailing.get("server-timing", "")))

        yield send


def case_variant(text: str, n: int) -> str:
    """``text`` with the case of its letters flipped after the bits of ``n``: a distinct cache
    key (the shipped policy does not fold case) for the same tokens (the model's tokenizer
    lowercases), so concurrent misses of one text are not coalesced into one backend call."""
    chars = list(text)
    letters = [i for i, c in enumerate(chars) if c.isalpha()]
    for bit, i in enumerate(letters):
        if n >> bit & 1:
            chars[i] = chars[i].swapcase()
    return "".join(chars)


@contextlib.asynccontextmanager
async def _gateway(url: str, route: str, pool: int) -> Any:
    """A miss through the gateway: ``Cache-Control: no-cache`` (lookup, backend call, store),
    each request's text a case variant of its own (see ``case_variant``), and an answer that
    is not a MISS counts as an error."""
    def body(text: str) -> bytes:
        if route == "oip":
            return rest_body(text)
        return orjson.dumps({"model": MODEL, "input": text})

    target = f"{url}/v2/models/{MODEL}/infer" if route == "oip" else f"{url}/v1/embeddings"
    headers = {"Content-Type": "application/json", "Cache-Control": "no-cache"}
    sequence = itertools.count(1)
    async with loadgen.client_session(pool=pool) as http:
        async def send(text: str) -> tuple[float, float]:
            data = body(case_variant(text, next(sequence)))
            started = time.perf_counter()
            async with http.post(target, data=data, headers=headers) as response:
                await response.read()
                if response.status != 200 or response.headers.get("X-Cache") != "MISS":
                    raise RuntimeError(f"status {response.status}, "
                                       f"X-Cache {response.headers.get('X-Cache')}")
                elapsed = (time.perf_counter() - started) * 1000
                return elapsed, server_ms(response.headers.get("Server-Timing", ""))

        yield send


def _through_gateway(upstream: str, route: str, src: Path | None = None) -> PathSpec:
    label = "OIP route" if route == "oip" else "/v1/embeddings"
    protocol = "REST" if upstream == "rest" else "gRPC"
    name = upstream if src is None else "before"
    return PathSpec(f"gateway miss, {label} -> backend over {protocol}"
                    + (f", gateway from {src}" if src is not None else ""),
                    lambda e, pool: _gateway(e.gateway_urls[name], route, pool),
                    f"gateway-{name}")


PATHS: tuple[PathSpec, ...] = (
    PathSpec("floor (a): bare aiohttp + uvloop, batch 1, one worker thread",
             lambda e, pool: _rest(f"{e.floor_url}/v2/models/{MODEL}/infer", pool), "floor"),
    PathSpec("backend direct, REST", lambda e, pool: _rest(
        f"{e.backend_url}/v2/models/{MODEL}/infer", pool), "backend"),
    PathSpec("backend direct, gRPC", lambda e, pool: _grpc(e.backend_grpc, pool), "backend"),
    PathSpec(FLOOR_B, lambda e, pool: _rest(f"{e.proxy_url}/v2/models/{MODEL}/infer", pool),
             "proxy"),
    _through_gateway("rest", "oip"),
    _through_gateway("grpc", "oip"),
    _through_gateway("rest", "embeddings"),
    _through_gateway("grpc", "embeddings"),
)


async def run_cell(send: Send, text: str, requests: int, concurrency: int, cell: Cell) -> None:
    """``requests`` requests from ``concurrency`` closed-loop clients, into ``cell``."""
    remaining = requests

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            try:
                latency, own = await send(text)
            except (aiohttp.ClientError, grpc.RpcError, RuntimeError, TimeoutError):
                cell.errors += 1
                continue
            cell.latency_ms.append(latency)
            cell.server_ms.append(own)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    cell.wall_s += time.perf_counter() - started


def cell_requests(plan: Plan, concurrency: int, text: str) -> int:
    """Requests per cell and round: long texts take ~6x the compute, so fewer of them; at more
    connections, enough for every client to send a few."""
    base = plan.requests if text == SHORT else max(10, plan.requests // 3)
    return base if concurrency == 1 else max(2 * concurrency, base * concurrency // 8)


def paths_of(plan: Plan) -> tuple[PathSpec, ...]:
    """The paths this run measures (an older backend has no gRPC), and an older gateway's."""
    before = (() if plan.gateway_src is None else
              (_through_gateway("rest", "oip", plan.gateway_src),
               _through_gateway("rest", "embeddings", plan.gateway_src)))
    return tuple(p for p in PATHS if not (plan.backend_src and "gRPC" in p.name)) + before


async def measure(plan: Plan, endpoints: Endpoints) -> dict[tuple[str, str, int], Cell]:
    """Every round, every cell, paths in rotating order."""
    cells: dict[tuple[str, str, int], Cell] = {}
    pool = max(plan.concurrency)
    paths = paths_of(plan)
    async with contextlib.AsyncExitStack() as stack:
        senders = [await stack.enter_async_context(path.sender(endpoints, pool))
                   for path in paths]
        for send in senders:  # warm-up: connections, caches, every text
            for text in TEXTS.values():
                await run_cell(send, text, 20, 4, Cell())
        for round_no in range(plan.rounds):
            for concurrency in plan.concurrency:
                for label, text in TEXTS.items():
                    order = list(range(len(paths)))
                    shift = round_no % len(order)
                    for index in order[shift:] + order[:shift]:
                        path = paths[index]
                        cell = cells.setdefault((path.name, label, concurrency), Cell())
                        pid = endpoints.pids[path.server]
                        main0, other0 = thread_cpu_s(pid)
                        await run_cell(senders[index], text,
                                       cell_requests(plan, concurrency, text), concurrency,
                                       cell)
                        main1, other1 = thread_cpu_s(pid)
                        cell.loop_cpu_s += main1 - main0
                        cell.other_cpu_s += other1 - other0
    return cells


# --- the run and its report ----------------------------------------------------------------


def main(argv: list[str]) -> int:
    """Runs the benchmark and prints its Markdown report; see the module doc."""
    if argv[:1] == ["floor"]:
        return floor_main(argv[1:])
    if argv[:1] == ["proxy"]:
        return proxy_main(argv[1:])
    plan = parse(argv)
    server_cores = plan.cores.server if plan.cores.pinned else None
    floor_port, port, grpc_port = free_port(), free_port(), free_port()
    threads = str(plan.threads)
    floor = Service("floor-a", [sys.executable, "-m", "bench.latency", "floor", "--port",
                                str(floor_port), "--models", str(plan.models), "--threads",
                                threads], cores=server_cores)
    env = {**os.environ, "BACKEND_ACCESS_LOG": "true" if plan.access_log else "false"}
    grpc_args = [] if plan.backend_src else ["--grpc-port", str(grpc_port)]
    backend = Service("backend", [
        sys.executable, "-m", "backend", "serve", "--models", str(plan.models.resolve()),
        "--host", "127.0.0.1", "--port", str(port), *grpc_args, "--threads", threads,
        "--device", "cpu"], cores=server_cores, env=env,
        cwd=str(plan.backend_src) if plan.backend_src else None)
    proxy_port = free_port()
    proxy = Service("floor-b", [sys.executable, "-m", "bench.latency", "proxy", "--port",
                                str(proxy_port), "--upstream", f"http://127.0.0.1:{floor_port}"],
                    cores=server_cores)
    try:
        with floor, backend, proxy, contextlib.ExitStack() as gateways:
            floor.wait_http(f"http://127.0.0.1:{floor_port}/v2/health/ready", timeout_s=180)
            backend.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=180)
            proxy.wait_http(f"http://127.0.0.1:{proxy_port}/v2/health/ready", timeout_s=60)
            upstreams = {"rest": f"http://127.0.0.1:{port}"}
            if not plan.backend_src:
                upstreams["grpc"] = f"grpc://127.0.0.1:{grpc_port}"
            started = {name: gateways.enter_context(services.gateway(
                url, cores=server_cores, name=f"gateway-{name}"))
                for name, url in upstreams.items()}
            if plan.gateway_src is not None:
                started["before"] = gateways.enter_context(services.gateway(
                    upstreams["rest"], cores=server_cores, name="gateway-before",
                    src=plan.gateway_src))
            endpoints = Endpoints(
                f"http://127.0.0.1:{floor_port}", f"http://127.0.0.1:{port}",
                f"127.0.0.1:{grpc_port}",
                {"floor": floor.pid, "backend": backend.pid, "proxy": proxy.pid,
                 **{f"gateway-{name}": gw.service.pid for name, gw in started.items()}},
                proxy_url=f"http://127.0.0.1:{proxy_port}",
                gateway_urls={name: gw.url for name, gw in started.items()})
            client = pinned(plan.cores.client) if plan.cores.pinned else contextlib.nullcontext()
            meter = Meter([floor, backend, proxy, *(gw.service for gw in started.values())])
            with client:
                import uvloop

                cells = uvloop.run(measure(plan, endpoints))
            others = meter.stop()
    except (RuntimeError, OSError) as exc:
        print(f"bench latency: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(report(plan, cells, others), flush=True)
    return 1 if any(cell.errors for cell in cells.values()) else 0


def others_line(others: float) -> str:
    """What the other processes' CPU says about the run."""
    verdict = ("quiet enough to decide" if others <= QUIET_CORES else
               f"NOT deciding: above {QUIET_CORES} cores, the load generator and the servers "
               "lose the CPU and every path looks alike")
    return f"Other processes held {others:.2f} cores while it measured ({verdict})."


def report(plan: Plan, cells: dict[tuple[str, str, int], Cell],
           others: float | None = None) -> str:
    """The Markdown report: method, one table per concurrency, the targets; ``others``: the
    cores other processes held while it measured (above ``QUIET_CORES``: not deciding)."""
    tokens = _token_counts(plan)
    lines = [
        f"Method: {plan.cores.describe()}; model {MODEL} fp32 on CPU, {plan.threads} ONNX "
        f"Runtime intra-op thread(s) in every server; texts: short ({tokens[SHORT]} tokens), "
        f"~200 tokens ({tokens[LONG]} tokens); {plan.rounds} interleaved rounds; backend "
        f"access log {'on' if plan.access_log else 'off'}"
        f"{f', backend from {plan.backend_src}' if plan.backend_src else ''}. Latency: client "
        "send to last byte. Outside: per request, latency minus the server's own reported "
        "queue + compute. Server CPU per request (from each thread's schedstat, so not skewed "
        "by other processes taking the CPU away): the event-loop thread, and the other threads "
        "(inference worker, ONNX Runtime, grpcio); on the floor (b) and gateway rows, that "
        "process's own (the gateway's other threads: grpcio, the node cache's writer). Gateway "
        "rows: every request Cache-Control: no-cache (a MISS: lookup, backend call, store) with "
        "its own case variant of the text (same tokens, its own cache key: no coalescing); one "
        "gateway worker, settings as shipped.",
    ]
    if others is not None:
        lines += ["", others_line(others)]
    for concurrency in plan.concurrency:
        lines += ["", f"**{concurrency} connection{'s' if concurrency > 1 else ''}**", "",
                  "| path | text | p50 ms | p99 ms | outside p50 ms | req/s | loop CPU us/req "
                  "| other CPU us/req | errors |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for path in paths_of(plan):
            for label in TEXTS:
                cell = cells.get((path.name, label, concurrency), Cell())
                lines.append(f"| {path.name} | {label} | {cell.p(50):.2f} | {cell.p(99):.2f} "
                             f"| {cell.outside_p50:.2f} | {cell.rate:.0f} "
                             f"| {cell.cpu_us(cell.loop_cpu_s):.0f} "
                             f"| {cell.cpu_us(cell.other_cpu_s):.0f} | {cell.errors} |")
    lines += ["", "| target | text | backend REST p50 - floor (a) p50 | same, outside p50 | met |",
              "| --- | --- | ---: | ---: | :---: |"]
    floor_name, rest_name = PATHS[0].name, PATHS[1].name
    for label in TEXTS:
        floor = cells.get((floor_name, label, 1), Cell())
        rest = cells.get((rest_name, label, 1), Cell())
        gap = rest.p(50) - floor.p(50)
        outside = rest.outside_p50 - floor.outside_p50
        lines.append(f"| backend direct p50 <= floor (a) p50 + {TARGET_MS} ms, 1 connection | "
                     f"{label} | {gap:+.2f} ms | {outside:+.2f} ms | "
                     f"{'yes' if gap <= TARGET_MS else 'NO'} |")
    lines += ["", "The outside-p50 gap leaves out the model's own compute time, whose jitter on a "
              "shared machine is larger than the target; the p50 gap is the target as stated."]
    lines += gateway_report(plan, cells)
    return "\n".join(lines)


def gateway_report(plan: Plan, cells: dict[tuple[str, str, int], Cell]) -> list[str]:
    """The gateway half: its target per upstream protocol and route, and REST vs gRPC."""
    def cell(name: str, label: str, concurrency: int) -> Cell:
        return cells.get((name, label, concurrency), Cell())

    floor_a, rest, floor_b = PATHS[0].name, PATHS[1].name, FLOOR_B
    gateway_paths = [p for p in paths_of(plan) if p.name.startswith("gateway")]
    lines = ["", "| target: gateway miss p50 - backend direct REST p50 <= (floor (b) - floor (a)) "
             f"+ {TARGET_MS} ms, 1 connection | text | gateway - backend p50 | allowed "
             "| same, outside p50 | allowed, outside | met |",
             "| --- | --- | ---: | ---: | ---: | ---: | :---: |"]
    for path in gateway_paths:
        for label in TEXTS:
            a, b = cell(floor_a, label, 1), cell(floor_b, label, 1)
            backend, gateway = cell(rest, label, 1), cell(path.name, label, 1)
            gap, allowed = gateway.p(50) - backend.p(50), b.p(50) - a.p(50) + TARGET_MS
            outside = gateway.outside_p50 - backend.outside_p50
            outside_allowed = b.outside_p50 - a.outside_p50 + TARGET_MS
            lines.append(f"| {path.name} | {label} | {gap:+.2f} ms | {allowed:+.2f} ms "
                         f"| {outside:+.2f} ms | {outside_allowed:+.2f} ms "
                         f"| {'yes' if gap <= allowed else 'NO'} |")
    pairs = [("backend direct", "backend direct, REST", "backend direct, gRPC")]
    for route in ("OIP route", "/v1/embeddings"):
        pairs.append((f"gateway miss, {route}", f"gateway miss, {route} -> backend over REST",
                      f"gateway miss, {route} -> backend over gRPC"))
    lines += ["", "| REST vs gRPC | connections | text | REST p50 ms | gRPC p50 ms | REST p99 ms "
              "| gRPC p99 ms | gRPC - REST p50 | REST req/s | gRPC req/s |",
              "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    known = {p.name for p in paths_of(plan)}
    for concurrency in plan.concurrency:
        for hop, over_rest, over_grpc in pairs:
            if over_grpc not in known:
                continue
            for label in TEXTS:
                r, g = cell(over_rest, label, concurrency), cell(over_grpc, label, concurrency)
                lines.append(f"| {hop} | {concurrency} | {label} | {r.p(50):.2f} | {g.p(50):.2f} "
                             f"| {r.p(99):.2f} | {g.p(99):.2f} | {g.p(50) - r.p(50):+.2f} ms "
                             f"| {r.rate:.0f} | {g.rate:.0f} |")
    return lines


def _token_counts(plan: Plan) -> dict[str, int]:
    from backend.repository import load_repository
    from backend.tokenizer import TextTokenizer

    config = next(c for c in load_repository(plan.models) if c.name == MODEL)
    tokenizer = TextTokenizer.from_file(config.tokenizer_path, max_length=config.max_seq_length)
    return {text: len(ids) for text, ids in zip(TEXTS.values(),
                                                tokenizer.tokenize(list(TEXTS.values())),
                                                strict=True)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
