"""The LiteLLM peer row of the gateway bench (bench/litellm.py).

Offline: a venv that cannot be made, a proxy that exits, a proxy whose cache does not answer all
give a skipped row with the reason (never an exception), and the report still renders. The live
test needs the pinned LiteLLM installed in the bench's cache dir: ``.ci/run`` installs it
(``python -m bench.litellm``); elsewhere the test is skipped with that command as the reason, and
under CI a missing install is a failure.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from bench import gateway, gateway_node, litellm, services
from bench.gateway_latency import MissLatency
from bench.gateway_throughput import Row
from bench.wrk import WrkResult
from tests.conftest import missing

BODY = orjson.dumps({"input": "How do I reset my password?", "model": "minilm"})
NOWHERE = "http://127.0.0.1:9"  # discard port: nothing listens, nothing leaves the host


def _fake_venv(root: Path, script: str) -> Path:
    venv = root / "litellm-fake"
    exe = venv / "bin" / "litellm"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (venv / litellm.MARKER).write_text(litellm.REQUIREMENT + "\n")
    return venv


def test_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert litellm.venv_dir() == tmp_path / "edge-gateway-bench" / f"litellm-{litellm.VERSION}"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert litellm.cache_root() == Path.home() / ".cache" / "edge-gateway-bench"


def test_a_venv_that_cannot_be_made_skips_the_row(tmp_path: Path) -> None:
    peer = litellm.Peer()
    venv = tmp_path / "cache" / "litellm"
    with litellm.serving(peer, NOWHERE, BODY, cores=None, venv=venv,
                         python=str(tmp_path / "no-such-python")) as server:
        assert server is None
    assert peer.skipped
    assert peer.reason.startswith("could not create a venv with")
    assert "\n" not in peer.reason
    assert not venv.exists()  # a failed attempt leaves nothing half-made
    assert peer.markdown().startswith(f"| {litellm.ROW}: skipped (could not create a venv")
    assert peer.markdown().count("|") == 10  # as many cells as the table's header
    assert all("| skipped |" in line for line in peer.targets(Row("gateway")))
    assert peer.notes() == [f"- {litellm.ROW}: skipped: {peer.reason}"]


def test_a_failed_pip_install_is_one_line_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real venv whose pip has no index and no config: fails at once, no network needed.
    for name, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
                        "PIP_CONFIG_FILE": os.devnull}.items():
        monkeypatch.setenv(name, value)
    venv = tmp_path / "litellm"
    with pytest.raises(litellm.Unavailable) as failed:
        litellm.install(venv, python=sys.executable, timeout_s=120)
    reason = str(failed.value)
    assert reason.startswith(f"pip install '{litellm.REQUIREMENT}' failed")
    assert "\n" not in reason and len(reason) < 400
    assert not venv.exists()


def test_a_finished_install_is_reused(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, "exit 0\n")
    # python is never run: the marker says the install finished
    assert litellm.install(venv, python=str(tmp_path / "no-such-python")) == (
        venv / "bin" / "litellm")


def test_a_proxy_that_exits_skips_the_row_with_its_error(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, "echo 'starting'\necho 'ValueError: bad config' >&2\nexit 3\n")
    peer = litellm.Peer()
    with litellm.serving(peer, NOWHERE, BODY, cores=None, venv=venv,
                         start_timeout_s=20) as server:
        assert server is None
    assert peer.reason.startswith("the proxy would not start: litellm exited early")
    assert "ValueError: bad config" in peer.reason
    assert "\n" not in peer.reason


def test_a_cache_that_does_not_answer_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0.0]

    def post(base_url: str, body: bytes) -> bytes:
        calls[0] += 1  # every request reaches the backend: no cache
        return orjson.dumps({"data": [{"embedding": [0.5, 0.25]}]})

    monkeypatch.setattr(litellm, "fetch", lambda url, body: (200, {"x-litellm-version": "x"}))
    monkeypatch.setattr(litellm, "_post", post)
    monkeypatch.setattr(litellm, "backend_requests", lambda url: calls[0])
    peer = litellm.Peer()
    with pytest.raises(litellm.Unavailable, match="the backend saw 3 of 3 repeats"):
        litellm.confirm_cache(peer, "http://127.0.0.1:1", "http://127.0.0.1:2", BODY)

    calls[0] = 0.0
    monkeypatch.setattr(litellm, "backend_requests", lambda url: 0.0)  # cached this time
    litellm.confirm_cache(peer, "http://127.0.0.1:1", "http://127.0.0.1:2", BODY)
    assert peer.version == "x"
    assert "backend_requests_total unchanged" in peer.check


def test_config_points_at_the_backend_with_the_cache_on() -> None:
    conf = yaml.safe_load(yaml.safe_dump(litellm.config("http://127.0.0.1:8001")))
    (model,) = conf["model_list"]
    assert model["model_name"] == "minilm"
    assert model["litellm_params"]["model"] == "openai/minilm"
    assert model["litellm_params"]["api_base"] == "http://127.0.0.1:8001/v1"
    settings = conf["litellm_settings"]
    assert settings["cache"] is True
    assert settings["cache_params"]["type"] == "local"
    assert settings["telemetry"] is False
    assert "database_url" not in conf["general_settings"]
    assert "master_key" not in conf["general_settings"]


def _run(rps: float) -> WrkResult:
    return WrkResult(requests=int(rps * 10), duration_s=10.0, errors=0, non_2xx=0, p50_ms=1.0,
                     p90_ms=2.0, p99_ms=3.0, p999_ms=4.0, mean_ms=1.2, bytes_read=50_000)


def _report(peer: litellm.Peer | None) -> str:
    plan = gateway.parse(["--quick"])
    hits = [Row("gateway, L1 hit"), Row("nginx"), Row("hello"), Row("floor")]
    hits[0].runs.append(_run(2000.0))
    hits[0].cpu.append(0.5)
    tiers = [Row("l1"), Row("l2")]
    return gateway.report(plan, hits, tiers, MissLatency(), {}, gateway_node.NodeBench(), peer)


def test_report_renders_with_the_row_skipped() -> None:
    peer = litellm.Peer(reason="pip install 'litellm[proxy]==1' failed: no network | none")
    text = _report(peer)
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith(f"| {litellm.ROW}"))
    assert "skipped (pip install" in row and "no network / none" in row  # no stray cell
    assert row.count("|") == 10
    assert lines[lines.index(row) - 1].startswith("| floor |")  # right under the hit rows
    assert "| gateway L1-hit req/s / LiteLLM proxy cached req/s (info) | skipped |" in text
    assert "| LiteLLM's CPU per cached hit / gateway's CPU per L1 hit (info) | skipped |" in text
    assert f"- {litellm.ROW}: skipped: pip install" in text
    assert "LiteLLM" not in _report(None)  # callers that do not pass it are unchanged


def test_report_shows_the_measured_row_and_ratio() -> None:
    peer = litellm.Peer(version="1.100.5", check="checked", backend_calls=0.0)
    peer.row.runs.append(_run(500.0))
    peer.row.cpu.append(1.0)
    text = _report(peer)
    assert f"| {litellm.ROW} | 500 |" in text
    assert "| gateway L1-hit req/s / LiteLLM proxy cached req/s (info) | 4.000 |" in text
    # 1 core / 500 req/s vs 0.5 core / 2000 req/s
    assert "| LiteLLM's CPU per cached hit / gateway's CPU per L1 hit (info) | 8.000 |" in text
    assert "litellm 1.100.5 (own venv)" in text
    assert "during the timed hit runs (a LiteLLM cache miss would show here): 0" in text
    assert "errors over the timed runs" not in text
    peer.row.runs.append(dataclasses.replace(_run(400.0), errors=3, non_2xx=1))
    assert "errors over the timed runs: 3 transport" in _report(peer)
    assert ", 1 non-2xx" in _report(peer)


def test_no_litellm_flag() -> None:
    assert gateway.parse([]).litellm is True
    assert gateway.parse(["--no-litellm"]).litellm is False


def test_live_proxy_answers_the_repeat_from_its_cache(models_dir: Path) -> None:
    if not (litellm.venv_dir() / litellm.MARKER).exists():
        missing("needs the pinned LiteLLM in the bench's cache dir: python -m bench.litellm")
    cores = frozenset(os.sched_getaffinity(0))
    peer = litellm.Peer()
    with services.backend(models_dir, cores=cores) as backend, \
            litellm.serving(peer, backend.url, BODY, cores=cores) as server:
        assert server is not None, peer.reason
        assert peer.version == litellm.VERSION
        before = litellm.backend_requests(backend.url)
        assert litellm._post(server.url, BODY)
        assert litellm.backend_requests(backend.url) == before
        pid = server.service.pid
    assert not Path(f"/proc/{pid}").exists() or not server.service.alive()
