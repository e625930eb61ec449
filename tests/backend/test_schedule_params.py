"""Triton's scheduling parameters, ``priority`` and ``timeout`` (microseconds), and the
``fairness_key``, sent by the official tritonclient over HTTP and gRPC to a real
``python -m backend serve`` process with the real model.

A large request of long texts at the lowest priority keeps the one worker busy with a backlog;
what the parameters change is then seen in order and counts, never in timings.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.procs import Service, free_port
from tests.backend.serving import metric

pytestmark = pytest.mark.model

LONG = "the quick brown fox jumps over the lazy dog " * 40  # past 256 tokens
BACKLOG = 48  # long texts at max batch 4: 12 batches, seconds of work on any machine


class Servers:
    def __init__(self, rest: str, grpc: str) -> None:
        self.rest, self.grpc = rest, grpc

    def metric(self, name: str, **labels: str) -> float:
        return metric(httpx.get(f"http://{self.rest}/metrics", timeout=10).text, name, **labels)


@contextlib.contextmanager
def serving(models_dir: Path, name: str, env: dict[str, str] | None = None
            ) -> Iterator[Servers]:
    """A real backend (REST and gRPC, max batch 4) with ``env`` as its environment."""
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
            "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
            "--device", "cpu", "--max-batch-size", "4", "--log-level", "WARNING"]
    with Service(name, argv, env=env) as server:
        server.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=180)
        yield Servers(f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")


@pytest.fixture(scope="module")
def servers(models_dir: Path) -> Iterator[Servers]:
    with serving(models_dir, "backend-sched") as started:
        yield started


class low_priority_backlog:  # a context manager, named for how it reads
    """A REST request of ``BACKLOG`` long texts at priority 3 (the lowest; ``parameters``: other
    scheduling parameters instead); entered once its backlog is queued. ``done`` is set when
    it has been answered."""

    def __init__(self, servers: Servers, parameters: dict[str, Any] | None = None) -> None:
        self.servers = servers
        self.parameters = {"priority": 3} if parameters is None else parameters
        self.status: int | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [BACKLOG],
                            "data": [LONG] * BACKLOG}], "parameters": self.parameters}
        try:
            self.status = httpx.post(f"http://{self.servers.rest}/v2/models/minilm/infer",
                                     json=body, timeout=300).status_code
        finally:
            self.done.set()

    def __enter__(self) -> low_priority_backlog:
        self.thread.start()
        for _ in range(2000):  # bounded: ~20 s
            if sum(self.servers.metric("backend_pending_requests", model="minilm",
                                       priority=str(p)) for p in (1, 2, 3)) > 0:
                return self
            if self.done.is_set():
                break
            threading.Event().wait(0.01)
        raise AssertionError("the backlog request never built a backlog")

    def __exit__(self, *exc: object) -> None:
        self.thread.join(300)
        assert self.status == 200


def http_input(texts: list[str]) -> httpclient.InferInput:
    tensor = httpclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def grpc_input(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def test_priority_one_overtakes_a_lower_backlog_over_http_and_grpc(servers: Servers) -> None:
    served_before = servers.metric("backend_queue_duration_seconds_count", model="minilm",
                                   priority="1")
    with low_priority_backlog(servers) as backlog:
        with httpclient.InferenceServerClient(servers.rest) as rest:
            result: Any = rest.infer("minilm", [http_input(["urgent over http"])], priority=1,
                                     parameters={"fairness_key": "k-http"})
        assert result.as_numpy("embedding").shape == (1, 384)
        with grpcclient.InferenceServerClient(servers.grpc) as rpc:
            answer: Any = rpc.infer("minilm", [grpc_input(["urgent over grpc"])], priority=1,
                                    parameters={"fairness_key": "k-grpc"})
        assert answer.as_numpy("embedding").shape == (1, 384)
        # Both answered while most of the earlier, lower backlog still waits.
        assert not backlog.done.is_set()
        assert servers.metric("backend_pending_requests", model="minilm", priority="3") > 0
    assert servers.metric("backend_queue_duration_seconds_count", model="minilm",
                          priority="1") == served_before + 2


def test_a_timeout_the_backlog_outlasts_is_refused_at_once_over_http_and_grpc(
    servers: Servers,
) -> None:
    rejected_before = servers.metric("backend_requests_rejected_total", model="minilm",
                                     priority="3", reason="deadline")
    with low_priority_backlog(servers) as backlog:
        with httpclient.InferenceServerClient(servers.rest) as rest, \
                pytest.raises(InferenceServerException) as over_http:
            rest.infer("minilm", [http_input(["behind it"])], priority=3, timeout=50_000)
        with grpcclient.InferenceServerClient(servers.grpc) as rpc, \
                pytest.raises(InferenceServerException) as over_grpc:
            rpc.infer("minilm", [grpc_input(["behind it"])], priority=3, timeout=50_000)
        assert not backlog.done.is_set()  # told now, not after the backlog
    assert "deadline" in str(over_http.value.message())
    assert over_http.value.status() == "503"
    assert over_grpc.value.status() == "StatusCode.UNAVAILABLE"
    assert "deadline" in str(over_grpc.value.message())
    assert servers.metric("backend_requests_rejected_total", model="minilm", priority="3",
                          reason="deadline") == rejected_before + 2


@pytest.mark.parametrize(("parameters", "message"), [
    ({"priority": -1}, "parameter 'priority' must be an integer"),
    ({"priority": "high"}, "parameter 'priority' must be an integer"),
    ({"timeout": 1.5}, "parameter 'timeout' must be an integer"),
    ({"fairness_key": 7}, "parameter 'fairness_key' must be a string"),
    ({"express": "yes"}, "parameter 'express' must be a boolean"),
    ({"express": 1}, "parameter 'express' must be a boolean"),
])
def test_bad_scheduling_parameters_are_400(servers: Servers, parameters: dict[str, Any],
                                           message: str) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
            "parameters": parameters}
    response = httpx.post(f"http://{servers.rest}/v2/models/minilm/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert message in response.json()["error"]
