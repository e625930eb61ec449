"""Gateway test fixtures: a real backend process serving the real model, and gateway apps."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.settings import load_settings
from gateway.tenants.directory import Tenants
from tests.conftest import REPO, free_port
from tests.gateway.upstream.upstream_rig import build, fakes  # noqa: F401 (shared fixtures)


@dataclass
class BackendProc:
    """A ``python -m backend serve`` process on a free loopback port."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: str | None = None
    """Its stderr (the backend's log), kept for the run: a failing test that used the backend
    shows the tail in its report (``pytest_runtest_makereport`` below)."""

    def log_tail(self, size: int = 4000) -> str:
        return "" if self.log_path is None else _tail(self.log_path, size)

    def requests_total(self) -> float:
        """Inference calls the backend has answered (from its own /metrics)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("backend_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def start_backend(models_dir: Path, *, zone: str = "local", region: str = "local",
                  extra: tuple[str, ...] = (), port: int | None = None) -> BackendProc:
    port = port or free_port()
    cmd = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
           "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
           "--zone", zone, "--region", region, *extra]
    # Its log goes to a file, not a pipe: a pipe nobody reads fills up with access lines after a
    # few hundred requests and then blocks the backend (and its shutdown) on its next log line.
    # The file is kept until the run ends, so that a failing test can show what the backend said.
    with tempfile.NamedTemporaryFile(prefix="backend-log-", suffix=".log", delete=False) as log:
        atexit.register(_remove, log.name)
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(proc, f"{url}/v2/health/ready", timeout_s=120, what="backend")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}{_tail(log.name, 2000)}") from None
    return BackendProc(url, port, proc, log.name)


def _tail(path: str, size: int) -> str:
    """The last ``size`` bytes of a log file, as text."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, os.path.getsize(path) - size))
            return log.read().decode(errors="replace")
    except OSError as exc:
        return f"(backend log unreadable: {exc})"


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test that used a real backend gets the tail of that backend's log in its
    report (a 5xx from the backend otherwise shows only as the gateway's "upstream error")."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, BackendProc) and value.log_path is not None:
            report.sections.append((f"{name}: backend log (tail)", value.log_tail()))


def wait_ready(proc: subprocess.Popen[bytes], url: str, *, timeout_s: float, what: str) -> None:
    """Polls ``url`` until it answers 200. Raises with the tail of the process's stderr if it
    exits first; stops it and raises ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}: {err[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_process(proc)
    raise TimeoutError(f"{what} did not become ready in {timeout_s:g} s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def backend(models_dir: Path) -> Iterator[BackendProc]:
    """One real backend (real ONNX Runtime, real MiniLM) for the whole session."""
    proc = start_backend(models_dir)
    try:
        yield proc
    finally:
        stop_process(proc.proc)


GatewayFactory = Callable[..., Any]


@pytest.fixture(autouse=True)
def _node_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node cache's default directory (``$XDG_CACHE_HOME/edge-gateway/node``) in this
    test's tmp dir, for gateways built here and the gateway processes tests start: no test
    reads or writes the user's, and no two tests share one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
async def gateway(backend: BackendProc, aiohttp_client: Any,
                  tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    """Factory: ``await gateway(redis={"url": ...}, policies={"path": ...})`` -> an aiohttp
    TestClient. Overrides are settings as ``load_settings`` takes them: top-level names, whole
    sections as mappings (merged with the fixture's defaults, not replacing them), or dotted
    names given as ``**{"routing.read_timeout_s": 2}``. Each gateway gets its own node cache
    directory in the test's tmp dir unless ``cache.node.path`` says otherwise."""
    clients: list[TestClient[Any, Any]] = []

    async def make(*, tenants: Tenants | None = None, clock: Callable[[], float] = time.time,
                   **overrides: Any) -> TestClient[Any, Any]:
        values: dict[str, Any] = {"backends": [backend.url], "routing.health_interval_s": 0.5,
                                  "cache.node.path": str(tmp_path / f"node-{len(clients)}")}
        values.update(overrides)
        settings = load_settings(None, values, environ={})
        app = create_app(settings, registry=CollectorRegistry(), tenants=tenants, clock=clock)
        client: TestClient[Any, Any] = await aiohttp_client(TestServer(app))
        clients.append(client)
        return client

    yield make


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def gateway_env() -> dict[str, str]:
    """The environment for a gateway process: none of the caller's GATEWAY_* settings, and a
    node cache directory of its own (the default one outlives the test run, and entries from an
    earlier run would answer requests this run never made)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["GATEWAY_CACHE_NODE_PATH"] = _node_dir()
    return env


def _node_dir() -> str:
    path = tempfile.mkdtemp(prefix="gw-test-node-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
