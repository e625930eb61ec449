"""The ``express`` parameter over both protocols, with the official tritonclient, against a
real ``python -m backend serve`` with the express lane on (``BACKEND_EXPRESS_LANE=1``) and the
real model: a request its caller judged quiet (``express: true``, what the gateway sends with
``admission.express`` for a tenant with no backlog) computes in the lane beside a busy key's
batch; one without it waits its fair turn in the queue. Seen in the lane's item count and in
order (the busy key's backlog still pending), never in timings."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.procs import Service, free_port
from tests.backend.serving import metric
from tests.backend.test_schedule_params import LONG, grpc_input, http_input

pytestmark = pytest.mark.model

BACKLOG = 48  # long texts at max batch 4: 12 batches, seconds of work on any machine


class Lane:
    def __init__(self, rest: str, grpc: str) -> None:
        self.rest, self.grpc = rest, grpc

    def metric(self, name: str, **labels: str) -> float:
        return metric(httpx.get(f"http://{self.rest}/metrics", timeout=10).text, name, **labels)


@pytest.fixture(scope="module")
def lane(models_dir: Path) -> Iterator[Lane]:
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
            "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
            "--device", "cpu", "--max-batch-size", "4", "--log-level", "WARNING"]
    env = {**os.environ, "BACKEND_EXPRESS_LANE": "1"}
    with Service("backend-express", argv, env=env) as server:
        server.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=180)
        yield Lane(f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")


class busy_key:  # a context manager, named for how it reads
    """Key A's REST request of ``BACKLOG`` long texts at the default priority; entered once
    its backlog is queued."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.status: int | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [BACKLOG],
                            "data": [LONG] * BACKLOG}], "parameters": {"fairness_key": "A"}}
        try:
            self.status = httpx.post(f"http://{self.lane.rest}/v2/models/minilm/infer",
                                     json=body, timeout=300).status_code
        finally:
            self.done.set()

    def __enter__(self) -> busy_key:
        self.thread.start()
        for _ in range(2000):  # bounded: ~20 s
            if sum(self.lane.metric("backend_pending_requests", model="minilm",
                                    priority=str(p)) for p in (1, 2, 3)) > 0:
                return self
            if self.done.is_set():
                break
            threading.Event().wait(0.01)
        raise AssertionError("key A's request never built a backlog")

    def __exit__(self, *exc: object) -> None:
        self.thread.join(300)
        assert self.status == 200


def test_a_request_judged_quiet_takes_the_lane_over_http_and_grpc_and_one_not_waits(
        lane: Lane) -> None:
    before = lane.metric("backend_express_items_total", model="minilm")
    with busy_key(lane) as backlog:
        with httpclient.InferenceServerClient(lane.rest) as rest:
            result: Any = rest.infer("minilm", [http_input(["quiet over http"])],
                                     parameters={"fairness_key": "B", "express": True})
        assert result.as_numpy("embedding").shape == (1, 384)
        with grpcclient.InferenceServerClient(lane.grpc) as rpc:
            answer: Any = rpc.infer("minilm", [grpc_input(["quiet over grpc"])],
                                    parameters={"fairness_key": "C", "express": True})
        assert answer.as_numpy("embedding").shape == (1, 384)
        assert not backlog.done.is_set()  # both answered beside A's backlog
        lane_items = lane.metric("backend_express_items_total", model="minilm")
        assert lane_items == before + 2
        # Not judged quiet (its gateway had a backlog of its tenant's calls): the queue.
        with httpclient.InferenceServerClient(lane.rest) as rest:
            rest.infer("minilm", [http_input(["busy over http"])],
                       parameters={"fairness_key": "D", "express": False})
        with grpcclient.InferenceServerClient(lane.grpc) as rpc:
            rpc.infer("minilm", [grpc_input(["busy over grpc"])],
                      parameters={"fairness_key": "E"})
        assert lane.metric("backend_express_items_total", model="minilm") == lane_items
