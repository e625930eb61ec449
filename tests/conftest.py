"""Shared fixtures: the built MiniLM model repository and a private redis-server per session.

Tests that need Redis start their own ``redis-server`` on a free loopback port (or use
``REDIS_URL`` when it is set). Under CI (``CI`` set) a missing ``redis-server`` is a failure,
never a skip; ``missing`` does the same for any other prerequisite. With ``GATEWAY_SKIPS_FILE``
set, the session writes every skipped test and its reason there (``.ci/run`` prints the list and
fails on any that is not GPU-only).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
MODELS = Path(os.environ.get("GATEWAY_TEST_MODELS", REPO / "models"))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def missing(why: str) -> NoReturn:
    """A prerequisite is absent: a failure under CI (``.ci/run`` installs everything), else a
    skip with ``why``."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must provide it: see .ci/run)")
    pytest.skip(why)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Write the skipped tests to ``$GATEWAY_SKIPS_FILE``, one ``nodeid: reason`` a line."""
    target = os.environ.get("GATEWAY_SKIPS_FILE")
    if not target:
        return
    lines = []
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        lines.append(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}\n")
    Path(target).write_text("".join(lines), encoding="utf-8")


@pytest.fixture(scope="session")
def reference() -> dict[str, object]:
    """sentence-transformers reference embeddings for all-MiniLM-L6-v2."""
    import orjson

    path = FIXTURES / "minilm_reference.json"
    data: dict[str, object] = orjson.loads(path.read_bytes())
    return data


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """The model repository with ``minilm`` built (built once if missing)."""
    if not (MODELS / "minilm" / "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "backend", "build-model", "minilm", "--out", str(MODELS)],
            check=True,
        )
    return MODELS


@dataclass
class RedisServer:
    """A running redis-server that this test session owns (or the one REDIS_URL names)."""

    url: str
    port: int
    proc: subprocess.Popen[bytes] | None
    workdir: str | None

    def kill(self) -> None:
        """Stop the server (to test Redis outages); ``start`` brings it back on the same port."""
        if self.proc is None:
            raise RuntimeError("cannot kill a Redis this session did not start (REDIS_URL)")
        self.proc.kill()
        self.proc.wait(timeout=10)

    def start(self) -> None:
        assert self.workdir is not None
        self.proc = _spawn_redis(self.port, self.workdir)


def _spawn_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server")
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", workdir, "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, 15)
    return proc


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server on a free port, stopped at the end of the session."""
    if os.environ.get("REDIS_URL"):
        yield RedisServer(os.environ["REDIS_URL"], 0, None, None)
        return
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI must install it: see .ci/run)")
        pytest.skip("redis-server is not installed; install it or set REDIS_URL")
    workdir = tempfile.mkdtemp(prefix="gw-redis-")
    port = free_port()
    server = RedisServer(f"redis://127.0.0.1:{port}/0", port, _spawn_redis(port, workdir), workdir)
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.terminate()
            server.proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> str:
    """The private Redis's URL, flushed before each test."""
    import redis.asyncio as aioredis

    if redis_server.proc is not None and redis_server.proc.poll() is not None:
        redis_server.start()
    client = aioredis.from_url(redis_server.url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
    return redis_server.url
