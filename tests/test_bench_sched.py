"""The scheduling benchmark's pieces that decide its figures: the plan, the tenants file (bulk is
batch class), the gateway's settings, the Batch API input, how C's connection count is chosen,
how A's flood is counted in B's window, the flood process itself (against a tiny server) and the
report's targets. The run itself is ``python -m bench sched`` (minutes, not a test)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import sched, sched_flood, sched_report
from bench.loadgen import LoadResult, Sample
from bench.procs import split_cores
from bench.sched_report import (
    BATCH,
    BULK_OPEN,
    EVEN,
    LOAD_07,
    NOISY,
    NOISY_OPEN,
    OVERLOAD,
    QUIET_03,
    QUIET_06,
    BatchRun,
    Calibration,
    CoreSplit,
    Round,
    Setup,
    report,
)
from bench.tenants import Phase
from gateway.batch.jsonl import check_upload, parse_request, split_lines
from gateway.tenants.directory import Tenants
from gateway.upstream.admission.fairqueue import BATCH as BATCH_CLASS
from gateway.upstream.admission.fairqueue import INTERACTIVE

ROOT = Path(__file__).resolve().parents[1]


def sample(i: int, status: int, ms: float) -> Sample:
    return Sample(index=i, sent_s=i / 100, latency_s=ms / 1000, lag_s=0.0, status=status)


def phase(name: str, tenant_of: object, statuses: list[tuple[int, float]],
          first: int = 0) -> Phase:
    result = LoadResult("open", [sample(first + i, s, ms) for i, (s, ms) in enumerate(statuses)],
                        1.0, len(statuses))
    return Phase(name, 1, 1.0, result, tenant_of, 0.0)  # type: ignore[arg-type]


def closed(ok: int, shed: int) -> LoadResult:
    return LoadResult("closed", [sample(i, 200, 5.0) for i in range(ok)]
                      + [sample(ok + i, 503, 1.0) for i in range(shed)], 1.0, ok + shed)


def test_the_plan_and_the_quick_mode() -> None:
    plan = sched.parse([])
    assert (plan.rounds, plan.burst, plan.c_clients, plan.flood_clients, plan.lines,
            plan.extra) == (2, 300, (8, 16, 64), 64, 10_000, True)
    quick = sched.parse(["--quick"])
    assert quick.rounds == 1 and quick.duration_s == 2.0 and quick.lines == 10_000
    other = sched.parse(["--c-clients", "32,4", "--flood-clients", "16", "--no-extra"])
    assert (other.c_clients, other.flood_clients, other.extra) == ((4, 32), 16, False)
    assert plan.settings == ()
    tuned = sched.parse(["--set", "admission.max_wait_factor=1", "--set", "a.b=x=y"])
    assert tuned.settings == (("admission.max_wait_factor", "1"), ("a.b", "x=y"))
    text = report(tuned.setup(), Calibration(), [], "now")
    assert "`batch.redis_url` set, `admission.max_wait_factor: 1`, `a.b: x=y`. Every" in text
    for bad in (["--c-clients", "8,x"], ["--c-clients", "0"], ["--lines", "50001"],
                ["--flood-clients", "0"], ["--set", "novalue"]):
        with pytest.raises(SystemExit):
            sched.parse(bad)


def test_the_tenants_file_makes_bulk_a_batch_tenant(tmp_path: Path) -> None:
    loaded = Tenants.load(sched.tenants_file(tmp_path))
    assert loaded.identify(f"Bearer {sched.KEYS['bulk']}") == "bulk"
    assert loaded.spec("bulk").priority == BATCH_CLASS
    assert loaded.spec("b").priority == INTERACTIVE


def test_the_gateway_gets_a_redis_for_batches_only(tmp_path: Path) -> None:
    settings = sched.gateway_settings(tmp_path, "redis://127.0.0.1:7001/0")
    assert settings == {"tenants_file": str(tmp_path / "tenants.yaml"),
                        "batch.redis_url": "redis://127.0.0.1:7001/0"}


def test_the_batch_is_10000_unique_one_text_lines_the_gateway_accepts() -> None:
    data = sched.batch_file(10_000, "x1")
    assert check_upload(data, max_lines=50_000, max_line_bytes=1 << 20) == 10_000
    texts = set()
    for number, raw in split_lines(data):
        _custom, body = parse_request(raw, number, sched.ROUTE)
        assert isinstance(body["input"], str)  # one text per line
        texts.add(body["input"])
    assert len(texts) == 10_000
    assert sched.short_text("x1", 7) in texts
    assert orjson.loads(sched.short("q", 3))["input"] == sched.short_text("q", 3)


def test_the_gate_refusals_are_read_by_reason() -> None:
    scraped = {'gateway_batch_deferred_total{reason="busy"}': 5.0,
               'gateway_batch_deferred_total{reason="loop_busy"}': 2.0,
               "gateway_batch_deferred_total{}": 9.0}
    assert sched.deferred_by_reason(scraped) == {"busy": 5.0, "loop_busy": 2.0}


def test_c_is_counted_in_2xx_answers_so_fast_503s_do_not_win() -> None:
    calibration = Calibration({8: closed(150, 0), 16: closed(160, 5), 64: closed(120, 900)})
    assert calibration.best == 16
    assert Calibration({8: closed(100, 0), 16: closed(100, 0)}).best == 8  # a tie: fewer
    assert "16 connections" in calibration.describe()
    with pytest.raises(ValueError):
        _ = Calibration().best


def test_a_is_counted_over_bs_window_by_the_time_its_answers_came() -> None:
    rows = [[0, 0.0, 0.5, 200],  # back at 10.5: before the window
            [1, 0.5, 0.6, 503],  # back at 11.1: in
            [2, 1.0, 0.1, 200],  # back at 11.1: in
            [3, 2.9, 0.2, 200]]  # back at 13.1: after
    found = sched.flood_in_window(rows, stamp=10.0, start=11.0, end=13.0)
    assert [(s.index - sched.A_INDEX, s.status) for s in found] == [(1, 503), (2, 200)]
    assert all(sched.merged_tenant(s.index) == "a" for s in found)
    assert sched.merged_tenant(0) == sched.merged_tenant(sched.A_INDEX - 1) == "b"


class Shedding:
    """Answers every request 503 + Retry-After and records what it saw."""

    def __init__(self) -> None:
        self.in_flight = self.peak = self.seen = 0
        self.keys: set[str] = set()
        self.cache: set[str] = set()

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.seen += 1
        self.keys.add(request.headers.get("Authorization", ""))
        self.cache.add(request.headers.get("Cache-Control", ""))
        try:
            await request.read()
            await asyncio.sleep(0.005)
            return web.json_response({"error": "busy"}, status=503,
                                     headers={"Retry-After": "1"})
        finally:
            self.in_flight -= 1


async def test_the_flood_is_a_closed_loop_that_ignores_503_and_retry_after(
        tmp_path: Path) -> None:
    shedding = Shedding()
    app = web.Application()
    app.router.add_post(sched.ROUTE, shedding.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    out = tmp_path / "flood.json"
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.sched_flood", "--url",
            str(server.make_url(sched.ROUTE)), "--tenant", "a", "--tag", "t", "--clients", "4",
            "--duration", "1.5", "--out", str(out), cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        printed, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    finally:
        await server.close()
    assert proc.returncode == 0, printed.decode()
    assert printed.decode().splitlines()[0] == "started"
    data = orjson.loads(out.read_bytes())
    statuses = [row[3] for row in data["samples"]]
    assert statuses and set(statuses) == {503}
    assert len(statuses) == shedding.seen > 4  # sent again at once after a 503 + Retry-After
    assert shedding.peak == 4  # on exactly its connections
    assert shedding.keys == {f"Bearer {sched.KEYS['a']}"} and shedding.cache == {"no-store"}
    assert data["stamp"] > 0 and data["cpu_s"] >= 0


def test_the_flood_output_round_trips() -> None:
    result = LoadResult("closed", [sample(0, 200, 4.0), sample(1, 503, 1.0)], 0.5, 2)
    data = orjson.loads(sched_flood.encode(12.5, result, 0.25))
    assert data["stamp"] == 12.5 and data["cpu_s"] == 0.25 and data["wall_s"] == 0.5
    assert data["samples"] == [[0, 0.0, 0.004, 200], [1, 0.01, 0.001, 503]]


def a_round(*, extra: bool) -> Round:
    ok = [(200, 10.0)] * 100
    noisy_b = phase("A + B", lambda i: sched.merged_tenant(i), [(200, 15.0)] * 30)
    a_part = [sample(sched.A_INDEX + i, 200 if i < 70 else 503, 40.0) for i in range(90)]
    noisy = Phase(noisy_b.name, 1, 30.0, LoadResult("open+closed", [*noisy_b.result.samples,
                                                                     *a_part], 1.0, 120),
                  sched.merged_tenant, 0.0)
    r = Round(1, 100.0)
    r.phases = {
        QUIET_03: phase("B alone 0.3", lambda i: "b", ok),
        NOISY: noisy,
        QUIET_06: phase("B alone 0.6", lambda i: "b", ok),
        BATCH: phase("B + batch", lambda i: "b", [(200, 12.0)] * 99 + [(503, 1.0)]),
        LOAD_07: phase("A 0.7", lambda i: "a", ok),
        OVERLOAD: phase("A 3x", lambda i: "a", [(200, 40.0)] * 50 + [(503, 1.0)] * 50),
    }
    if extra:
        even = phase("A and B evenly busy", sched.even, [(200, 10.0)] * 96 + [(503, 1.0)] * 4)
        r.phases[EVEN] = dataclasses.replace(even, offered=math.nan)
        r.phases[NOISY_OPEN] = phase("A open + B", lambda i: "b" if i % 10 == 0 else "a",
                                     [(200, 25.0)] * 100)
        r.phases[BULK_OPEN] = phase("B + bulk", lambda i: "b" if i % 2 else "bulk",
                                    [(200, 30.0)] * 100)
    r.batch = BatchRun(lines=10_000, before=32, completed=300, failed=0, seconds=10.0,
                       status="cancelled", deferred={"busy": 12.0, "queued": 0.0, "slow": 3.0})
    r.burst = sched.Burst(c_long=50.0, result=LoadResult(
        "closed", [sample(i, 200 if i < 20 else 503, 300.0 if i < 20 else 20.0)
                   for i in range(100)], 1.0, 100), computed=21.0, other_cpu=0.0)
    return r


def test_the_report_computes_the_issues_targets_from_its_set_up() -> None:
    setup = Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000)
    calibration = Calibration({8: closed(90, 0), 16: closed(100, 0), 64: closed(80, 400)})
    text = report(setup, calibration, [a_round(extra=True)], "now")
    assert "| Noisy (A closed loop): B goodput | 1.000 | >= 0.95 | yes |" in text
    assert "| Noisy (A closed loop): B p99 / B alone | 1.500 | <= 2 | yes |" in text
    # A's 70 2xx + B's 30 over the window, against C = 100
    assert "| Noisy (A closed loop): (A + B) 2xx/s / C | 1.000 | >= 0.85 | yes |" in text
    assert "| Batch API beside B: B p99 / B alone | 1.200 | <= 1.5 | yes |" in text
    assert "| Batch API beside B: B goodput | 0.990 | >= 0.99 | yes |" in text
    # 300 lines in 10 s = 30/s against the spare 0.4 x 100
    assert "| Batch API beside B: batch lines/s / (C - 0.6 C) | 0.750 | >= 0.6 | yes |" in text
    assert "| Overload 3x C: 2xx/s / C | 0.500 | >= 0.9 | NO |" in text
    assert "| Deadlines: served / (0.9 x C_long x 0.6 s) | 0.741 | >= 1 | NO |" in text
    assert "| Deadlines: computed / served | 1.050 | <= 1.1 | yes |" in text
    assert "| Deadlines: non-served p50 ms | 20.000 | <= 100 | yes |" in text
    extra = text.split("| extra, not the issue's set-up")[1]
    assert "| Extra, A open loop: B p99 / B alone | 2.500 | <= 2 | NO |" in extra
    assert "| Extra, bulk open loop: B p99 / B alone | 3.000 | <= 1.5 | NO |" in extra
    assert "| Extra, bulk open loop: batch lines/s / (C - 0.6 C) | 1.250 | >= 0.6 | yes |" \
        in extra
    # 96 of 100 answered in the phase's second, a and b in turn, against C = 100
    assert "| Extra, A and B evenly busy: (A + B) 2xx/s / C | 0.960 | >= 0.95 | yes |" in extra
    assert "| 1 | A and B evenly busy | closed | a | 50 | 48 |" in text
    assert "| 1 | A and B evenly busy | closed | b | 50 | 48 |" in text
    assert "Noisy (A closed loop)" not in extra
    assert "16 connections." in text  # C's connection count, said
    assert ("| 1 | 10000 | 32 | 300 | 0 | 10.0 | 30.0 | 40.0 | 0.750 | cancelled "
            "| busy 12, slow 3 |") in text


def test_the_report_leaves_the_extra_table_out_without_the_extra_phases() -> None:
    setup = Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000)
    text = report(setup, Calibration({8: closed(100, 0)}), [a_round(extra=False)], "now")
    assert "extra, not the issue's set-up" not in text
    assert "| Noisy (A closed loop): B goodput | 1.000 |" in text


def test_bs_time_is_split_by_its_answers_server_timing() -> None:
    """Each B answer's stages: the backend's queue and compute, the gateway's part of its
    total, and what came before the gateway's clock; 503s and answers without timing are
    left out; the table names each B phase of each round."""
    def timed(i: int, status: int, ms: float, **t: float) -> Sample:
        return dataclasses.replace(sample(i, status, ms), info={f"t_{k}": v for k, v in t.items()})

    samples = [timed(0, 200, 20.0, queue=6.0, compute=8.0, total=19.0),
               timed(1, 200, 12.0, queue=2.0, compute=5.0, total=10.0),
               timed(2, 503, 3.0, total=1.0), sample(3, 200, 9.0)]
    noisy = Phase("A closed loop + B", 1, 1.0, LoadResult("open", samples, 1.0, 4),
                  lambda i: "b", 0.25)  # 0.25 cores of steal
    stages = sched_report.b_stages(noisy)
    assert stages == {"backend queue": [6.0, 2.0], "backend compute": [8.0, 5.0],
                      "gateway": [5.0, 3.0], "before the gateway": [1.0, 2.0]}
    r = Round(1, 100.0, {NOISY: noisy})
    text = report(Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000), Calibration(), [r], "now")
    # loadgen.percentile interpolates: the p50 of two values is their mean
    assert "| 1 | A closed loop + B | 2 | 4.0 / 6.0 | 6.5 / 8.0 | 4.0 / 5.0 | 1.5 / 2.0 |" in text
    # the phase row ends with ours CPU, other CPU and steal (cores)
    assert "| 1 | A closed loop + B | 1 | b | 4 | 3 |" in text and "| 0.00 | 0.00 | 0.25 |" in text
    bare = Round(1, 100.0, {NOISY: phase("B", lambda i: "b", [(200, 5.0)])})
    assert "Where B's time goes" not in report(
        Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000), Calibration(), [bare], "now")


def test_the_report_says_when_c_moved_too_much_between_rounds() -> None:
    setup = Setup(split_cores(), 2, 2.0, 3.0, 64, 10_000)
    steady = report(setup, Calibration(), [Round(1, 100.0), Round(2, 114.0)], "now")
    assert "C moved" not in steady
    moved = report(setup, Calibration(), [Round(1, 100.0), Round(2, 130.0)], "now")
    assert "**C moved 30% between rounds**" in moved
    assert sched_report.c_spread([Round(1, 100.0), Round(2, math.nan)]) == 0.0


def test_the_report_splits_the_server_core_per_phase() -> None:
    """Each server's cores over the phase, the backend's CPU per answer and texts per batch:
    C's closed loop (full batches) beside an open loop at 3x C (the gateway's refusals)."""
    c = CoreSplit(wall_s=8.0, gateway_s=1.2, backend_s=6.4, answers=1600, texts=1600.0,
                  batches=640.0)
    overload = CoreSplit(wall_s=8.0, gateway_s=2.24, backend_s=5.6, answers=1000,
                         texts=1000.0, batches=800.0)
    idle = CoreSplit(wall_s=8.0, gateway_s=0.0, backend_s=0.0, answers=0, texts=0.0,
                     batches=0.0)
    assert (c.texts_per_batch, c.backend_ms_per_answer) == (2.5, 4.0)
    assert math.isnan(idle.texts_per_batch) and math.isnan(idle.backend_ms_per_answer)
    r = Round(1, 200.0, cores={"C: closed loop": c, "A alone at 3x C": overload})
    text = report(Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000), Calibration(), [r], "now")
    assert "| 1 | C: closed loop | 0.15 | 0.80 | 1600 | 4.00 | 2.50 |" in text
    assert "| 1 | A alone at 3x C | 0.28 | 0.70 | 1000 | 5.60 | 1.25 |" in text
    assert "Where the server core goes" not in report(
        Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000), Calibration(), [Round(1, 200.0)], "now")


def test_an_empty_run_still_reports() -> None:
    text = report(Setup(split_cores(), 1, 2.0, 3.0, 64, 10_000), Calibration(), [], "now")
    assert "target" not in text and "C was not measured" in text
    assert math.isnan(BatchRun(1, 0, 0, 0, 0.0, "cancelled").rate)


class _Tenants:
    """A stand-in gateway on a thread of its own: 503 for A's key, 200 for B's."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        key = request.headers.get("Authorization", "")
        tenant = next(t for t, k in sched.KEYS.items() if key == f"Bearer {k}")
        self.seen[tenant] = self.seen.get(tenant, 0) + 1
        await asyncio.sleep(0.002)
        return web.json_response({}, status=503 if tenant == "a" else 200)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post(sched.ROUTE, self.handle)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> _Tenants:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


def test_the_noisy_phase_puts_as_answers_in_a_and_bs_in_b(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = dataclasses.replace(sched.parse(["--duration", "1"]), flood_clients=4)
    computed = iter([(10.0, 5.0), (40.0, 20.0)])  # the backend's batch counts, before and after
    monkeypatch.setattr(sched, "_batches", lambda backend: next(computed))
    idle = SimpleNamespace(service=SimpleNamespace(cpu_seconds=lambda: 0.0))
    with _Tenants() as fake:
        gateway = SimpleNamespace(host="127.0.0.1", port=fake.port,
                                  url=f"http://127.0.0.1:{fake.port}", service=idle.service)
        runner = sched.Runner(plan, gateway, idle, idle, None, tmp_path)  # type: ignore[arg-type]
        noisy = runner.flooded("noisy", 1, "t", rate=20.0)
    b, a = noisy.of("b"), noisy.of("a")
    assert len(b) == 20 and {s.status for s in b} == {200}  # B's open loop, all B's
    assert a and {s.status for s in a} == {503}  # A's answers in B's window, all A's
    assert fake.seen["a"] > len(a)  # A ran before and after B's window too
    assert noisy.offered == 20.0
    split = runner.splits["noisy"]
    assert split.answers == len(b)  # A's were all 503 here
    assert (split.texts, split.batches, split.texts_per_batch) == (30.0, 15.0, 2.0)


def test_the_evenly_busy_phase_is_cs_closed_loop_with_a_and_b_in_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = sched.parse(["--duration", "0.5"])
    monkeypatch.setattr(sched, "_batches", lambda backend: (0.0, 0.0))
    idle = SimpleNamespace(service=SimpleNamespace(cpu_seconds=lambda: 0.0))
    with _Tenants() as fake:
        gateway = SimpleNamespace(host="127.0.0.1", port=fake.port,
                                  url=f"http://127.0.0.1:{fake.port}", service=idle.service)
        runner = sched.Runner(plan, gateway, idle, idle, None, tmp_path)  # type: ignore[arg-type]
        even = runner.evenly(1, clients=4)
    a, b = even.of("a"), even.of("b")
    assert {s.status for s in a} == {503} and {s.status for s in b} == {200}  # by key
    assert abs(len(a) - len(b)) <= 1 and fake.seen["a"] == len(a) and fake.seen["b"] == len(b)
    assert math.isnan(even.offered) and even.result.mode == "closed"
    assert runner.splits[even.name].answers == len(b)


def test_a_phases_core_split_counts_the_merged_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The noisy phase's split is read over B's window, and A's answers merged into that
    window count in it, not only the open loop's."""
    idle = SimpleNamespace(service=SimpleNamespace(cpu_seconds=lambda: 0.0),
                           url="http://127.0.0.1:9")
    runner = sched.Runner(sched.parse(["--duration", "1"]), idle, idle, idle, None,  # type: ignore[arg-type]
                          tmp_path)
    monkeypatch.setattr(sched, "_batches", lambda backend: (0.0, 0.0))
    b_only = closed(4, 1)
    monkeypatch.setattr(runner, "_open_loop", lambda *args: b_only)
    merged = LoadResult("open+closed", [*b_only.samples, *closed(3, 2).samples], 1.0, 10)
    runner.opened("noisy", 1, "t", 5.0, lambda i: "b", merge=lambda opened, start: merged)
    assert runner.splits["noisy"].answers == 7  # B's 4 and A's 3
