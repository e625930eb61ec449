"""The ``express`` parameter over both protocols, with the official tritonclient, against a
real ``python -m backend serve`` with the express lane on (``BACKEND_EXPRESS_LANE=1``) and the
real model: a request its caller judged quiet (``express: true``, what the gateway sends with
``admission.express`` for a tenant with no backlog) computes in the lane beside a busy key's
batch; one without it waits its fair turn in the queue. Seen in the lane's item count and in
order (the busy key's backlog still pending), never in timings."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.procs import Service, free_port
from tests.backend.test_schedule_params import (
    Servers,
    grpc_input,
    http_input,
    low_priority_backlog,
)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def lane(models_dir: Path) -> Iterator[Servers]:
    port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models_dir),
            "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
            "--device", "cpu", "--max-batch-size", "4", "--log-level", "WARNING"]
    env = {**os.environ, "BACKEND_EXPRESS_LANE": "1"}
    with Service("backend-express", argv, env=env) as server:
        server.wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=180)
        yield Servers(f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")


def test_a_request_judged_quiet_takes_the_lane_over_http_and_grpc_and_one_not_waits(
        lane: Servers) -> None:
    before = lane.metric("backend_express_items_total", model="minilm")
    # Key A's long backlog at the default priority: the regular worker is busy with it.
    with low_priority_backlog(lane, {"fairness_key": "A"}) as backlog:
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
