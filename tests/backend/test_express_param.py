"""The ``express`` parameter over both protocols, with the official tritonclient, against a
real ``python -m backend serve`` with the express lane on (``BACKEND_EXPRESS_LANE=1``) and the
real model: a request its caller judged quiet (``express: true``, what the gateway sends with
``admission.express`` for a tenant with no backlog) computes in the lane beside a busy key's
batch; one without it waits its fair turn in the queue. Seen in the lane's item count and in
order (the busy key's backlog still pending), never in timings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.backend.test_schedule_params import (
    Servers,
    grpc_input,
    http_input,
    low_priority_backlog,
    serving,
)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def lane(models_dir: Path) -> Iterator[Servers]:
    with serving(models_dir, "backend-express",
                 {**os.environ, "BACKEND_EXPRESS_LANE": "1"}) as started:
        yield started


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
