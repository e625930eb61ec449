"""Batch test fixtures: a persistent Redis (AOF, fsync always) these tests may kill and restart,
gateway processes in front of the real backend, and the official ``openai`` client.

The Redis is this module's own (not the session's shared one): the crash and restart tests
kill it with SIGKILL and start it again on the same port and directory, and it must come back
with the queue, the pending entries and the results, as a production batch Redis does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
import yaml

from bench.procs import Service
from bench.services import Server
from gateway.tenants.directory import key_digest
from tests.conftest import free_port, wait_port
from tests.gateway.conftest import BackendProc, gateway_env

KEYS = {"acme": "acme-batch-test-key-0001", "globex": "globex-batch-test-key-0002"}
POLL_S = 0.2


@dataclass
class PersistentRedis:
    """A redis-server with an append-only file, killed and restarted by PID on demand."""

    port: int
    workdir: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server")
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.workdir,
             "--protected-mode", "yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, 15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # loading the AOF: answers LOADING until done
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        raise TimeoutError("redis did not finish loading its append-only file")

    def kill(self) -> None:
        """SIGKILL, as a crash: only what the AOF holds survives."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


@pytest.fixture(scope="module")
def batch_redis() -> Iterator[PersistentRedis]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI must install it: see .ci/run)")
        pytest.skip("redis-server is not installed")
    server = PersistentRedis(free_port(), tempfile.mkdtemp(prefix="gw-batch-redis-"))
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def tenants_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tenants") / "tenants.yaml"
    lines = ["tenants:"] + [f"  {t}:\n    api_keys_sha256: [\"{key_digest(k)}\"]"
                            for t, k in KEYS.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class Gateways:
    """Gateway processes started for one module, all stopped by PID at its end."""

    backend: BackendProc
    redis: PersistentRedis
    tenants: Path
    workdir: Path
    started: list[Server] = field(default_factory=list)

    def start(self, *, backend_url: str | None = None, **batch: Any) -> Server:
        """A gateway process over this module's Redis, in front of the real backend (or
        ``backend_url``: then ready once it answers ``/healthz``, backend or not), with
        ``batch`` settings on top of quick take-over defaults."""
        n = len(self.started)
        settings = {"tenants_file": str(self.tenants), "logging": {"level": "WARNING"},
                    "routing": {"health_interval_s": 0.5},
                    "cache": {"node": {"path": str(self.workdir / f"node-{n}")}},
                    "batch": {"claim_idle_s": 2.0, "retry_max_s": 0.5, **batch}}
        config = self.workdir / f"gateway-{n}.yaml"
        config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        port = free_port()
        argv = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port",
                str(port), "--backend", backend_url or self.backend.url, "--workers", "1",
                "--redis", self.redis.url, "--config", str(config)]
        server = Server(Service(f"batch-gateway-{n}", argv, env=gateway_env()).start(), port)
        self.started.append(server)
        ready = "/healthz" if backend_url else "/readyz"
        server.service.wait_http(server.url + ready, timeout_s=60)
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()


@pytest.fixture(scope="module")
def gateways(backend: BackendProc, batch_redis: PersistentRedis, tenants_file: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    found = Gateways(backend, batch_redis, tenants_file, tmp_path_factory.mktemp("gateways"))
    try:
        yield found
    finally:
        found.stop_all()


def client(server: Server, tenant: str = "acme") -> openai.OpenAI:
    """The official client, as an application would configure it."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0,
                         timeout=30.0)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    import orjson

    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def embedding_lines(texts: list[str], prefix: str = "req") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "minilm", "input": text}} for i, text in enumerate(texts)]


def wait_finished(api: openai.OpenAI, batch_id: str, timeout_s: float = 60.0) -> Any:
    """Polls the batch until it reaches a final status (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = api.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch still {batch.status} after {timeout_s:g} s: "
                               f"{batch.request_counts}")
        time.sleep(POLL_S)


def read_lines(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    import orjson

    if file_id is None:
        return []
    data = api.files.content(file_id).read()
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]
