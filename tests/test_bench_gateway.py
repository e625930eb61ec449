"""The gateway and overload benchmarks' helpers: wrk scripts and results, nginx, the fakes.

Functional only (real processes on loopback where a binary is installed); no assertions about
speed.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench import nginx, overload, services, wrk
from bench.gateway_latency import PathSamples
from bench.gateway_probe import Probe, server_timing
from bench.loadgen import Reply
from bench.procs import Service, busy_seconds
from bench.slow_backend import SlowBackend
from gateway.settings import load_settings
from tests.conftest import missing

WRKJSON = ('WRKJSON {"requests": 1000, "duration_us": 2000000, "bytes": 5000, "connect": 0, '
           '"read": 1, "write": 0, "status": 3, "timeout": 2, "p50": 1500, "p90": 2000, '
           '"p99": 4000, "p999": 9000, "mean": 1600.5}')


def test_parse_reads_the_done_line() -> None:
    result = wrk.parse("Running 2s test\n" + WRKJSON + "\nRequests/sec: 500\n")
    assert result.requests == 1000
    assert result.rps == pytest.approx(500.0)
    assert (result.errors, result.non_2xx) == (3, 3)
    assert not result.clean
    assert result.p50_ms == pytest.approx(1.5)
    assert result.p99_ms == pytest.approx(4.0)


def test_parse_without_results_raises() -> None:
    with pytest.raises(RuntimeError, match="no results"):
        wrk.parse("nothing here", "lua error")


def test_lua_string_survives_closing_brackets() -> None:
    assert wrk.lua_string("abc") == "[[abc]]"
    assert wrk.lua_string('{"a": [["x"]]}') == '[=[{"a": [["x"]]}]=]'


def test_script_single_body_uses_wrk_body() -> None:
    text = wrk.script("/v1/embeddings", [b'{"input": "x"}'], {"Content-Type": "application/json"})
    assert 'wrk.body = [[{"input": "x"}]]' in text
    assert "[ [[Content-Type]] ] = [[application/json]]" in text
    assert "done = function" in text


def test_script_many_bodies_rotates() -> None:
    text = wrk.script("/p", [b"a", b"b", b"c"], {})
    assert "request = function()" in text
    assert "[[a]],\n  [[b]],\n  [[c]]" in text


def test_service_is_pinned_and_stopped_by_pid() -> None:
    core = min(os.sched_getaffinity(0))
    service = Service("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"],
                      cores=frozenset({core}))
    with service:
        status = Path(f"/proc/{service.pid}/status").read_text()
        allowed = next(line for line in status.splitlines()
                       if line.startswith("Cpus_allowed_list"))
        assert allowed.split()[-1] == str(core)
        assert service.alive()
    assert not service.alive()
    assert os.sched_getaffinity(0) != frozenset() and core in os.sched_getaffinity(0)


async def test_slow_backend_answers_oip_and_bounds_its_queue() -> None:
    fake = SlowBackend(slots=1, service_ms=200, dim=4, max_queue=0)
    async with TestClient(TestServer(fake.app())) as client:
        meta = await (await client.get("/v2/models/minilm")).json()
        assert meta["versions"] == ["1"]
        body = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                         "data": ["a", "b"]}]})
        first = asyncio.ensure_future(client.post("/v2/models/minilm/infer", data=body))
        await asyncio.sleep(0.05)  # the first holds the only slot
        second = await client.post("/v2/models/minilm/infer", data=body)
        assert second.status == 503
        assert "Retry-After" in second.headers
        answer = await first
        assert answer.status == 200
        doc = await answer.json()
        assert doc["outputs"][0]["shape"] == [2, 4]
        assert len(doc["outputs"][0]["data"]) == 8
        assert "compute;dur=200" in answer.headers["Server-Timing"]


def test_server_timing_parses_durations() -> None:
    reply = Reply(200, {"Server-Timing": "parse;dur=0.1, upstream;dur=2.5, total;dur=3"}, b"")
    assert server_timing(reply) == {"parse": 0.1, "upstream": 2.5, "total": 3.0}


def test_nginx_caches_posts_and_wrk_measures_it() -> None:
    if not (wrk.available() and nginx.available()):
        missing("needs wrk and nginx (apt-get install wrk nginx)")
    cores = frozenset(os.sched_getaffinity(0))
    with services.hello(cores=cores) as hello, nginx.NginxCache(hello.host_port,
                                                                cores=cores) as proxy:
        probe = Probe.check(proxy.base_url, b'{"input": "x"}', "X-Nginx-Cache", "HIT")
        assert probe.ok, probe.describe()
        result = wrk.run(proxy.base_url, "/v1/embeddings", [b'{"input": "x"}'],
                         headers={"Content-Type": "application/json"}, connections=4,
                         duration_s=1, cores=cores)
        assert result.requests > 0
        assert result.clean
        prefix = proxy.prefix
    assert not proxy.service.alive()
    assert not Path(prefix).exists()


def test_busy_seconds_grows() -> None:
    first = busy_seconds()
    sum(i * i for i in range(200_000))  # burn a little CPU
    assert busy_seconds() >= first > 0


def test_outside_p50_subtracts_backend_time_per_request() -> None:
    path = PathSamples("p", latency=[10.0, 12.0, 30.0], backend=[9.0, 10.0, math.nan])
    assert path.outside_p50 == pytest.approx(1.5)
    assert path.backend_p50 == pytest.approx(9.5)


def test_overload_defaults_give_a_small_queue() -> None:
    plan = overload.parse([])
    assert (plan.tier_concurrency, plan.tier_queue) == (4, 1)
    assert plan.settings() == {"admission.tier_concurrency": 4, "admission.tier_queue": 1,
                               "default_timeout_ms": 1000}
    loaded = load_settings(None, plan.settings(), environ={})  # what the gateway will run with
    assert (loaded.admission.tier_concurrency, loaded.admission.tier_queue) == (4, 1)
    quick = overload.parse(["--quick", "--slots", "8"])
    assert (quick.rounds, quick.tier_concurrency, quick.tier_queue) == (1, 8, 2)


def test_overload_adaptive_plan() -> None:
    plan = overload.parse(["--adaptive"])
    assert plan.adaptive and (plan.tier_concurrency, plan.tier_queue, plan.clients) == (64, 1, 5)
    assert plan.settings()["admission.adaptive.enabled"] is True
    assert load_settings(None, plan.settings(), environ={}).admission.adaptive.enabled
    assert overload.parse(["--no-realtime"]).realtime is False


def test_overload_bench_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    """One short round against the fake backend, a real gateway and the hello-world floor."""
    assert overload.main(["--rounds", "1", "--duration", "1", "--adaptive"]) == 0
    out = capsys.readouterr().out
    phases = [line for line in out.splitlines() if line.startswith("| 1 |")]
    assert [p.split("|")[2].strip() for p in phases] == [
        "capacity C, closed loop", "0.7x C, open loop", "3x C, open loop",
        "floor: hello-world at 3x C"]
    assert "| shed (503) p99, ms |" in out
    assert 'gateway_concurrency_limit{tier="zone"}' in out  # read back from /metrics
    assert "503s carrying Retry-After:" in out
