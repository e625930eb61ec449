"""Every backend call carries the priority, the tenant's fairness key and the remaining
deadline, set by the gateway (gateway/upstream/schedule.py); over ``MemoryTransport``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.tenants.quota.spec import TenantSpec, parse_spec
from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, Priority
from gateway.upstream.schedule import Schedule, client_schedule, fairness_key
from tests.gateway.upstream.test_upstream_retry import healthy, rig


def sent_parameters(r: Any) -> list[dict[str, Any]]:
    return [orjson.loads(req.body)["parameters"] for req in r.upstream._transport.requests]


async def test_each_call_carries_priority_fairness_key_and_deadline() -> None:
    r = rig({"near": ("a", healthy)})
    await r.upstream.infer_texts("minilm", ["hi"], request_id="r1", deadline=r.clock() + 2,
                                 tenant="acme")
    await r.upstream.infer_texts("minilm", ["hi"], request_id="r2", deadline=r.clock() + 2,
                                 tenant="acme", priority=BATCH)
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}
    await r.upstream.infer_raw("minilm", {"inputs": [text], "parameters": {
        "fairness_key": "forged", "priority": 1, "custom": True}}, request_id="r3",
        deadline=r.clock() + 2, tenant="other", client_priority=2)
    first, batch, raw = sent_parameters(r)
    assert first["priority"] == 1 and batch["priority"] == 3
    assert first["fairness_key"] == batch["fairness_key"] == fairness_key("acme")
    assert "acme" not in first["fairness_key"]
    # The client's key and priority are replaced; what else it asked for goes through.
    assert raw == {"fairness_key": fairness_key("other"), "priority": 2, "custom": True}
    timeouts = [int(h["X-Request-Timeout-Ms"]) for _, h in r.hosts.seen]
    assert all(0 < ms <= 2000 for ms in timeouts)


async def test_with_express_a_quiet_tenants_call_asks_for_the_lane_and_a_clients_own_ask_is_dropped(
) -> None:
    from gateway.upstream.admission.adaptive import AdaptiveSettings
    from gateway.upstream.admission.settings import AdmissionSettings

    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}
    forged = {"inputs": [text], "parameters": {"express": True, "custom": 1}}
    for express in (False, True):
        r = rig({"near": ("a", healthy)}, admission=AdmissionSettings(
            express=express, adaptive=AdaptiveSettings(enabled=False)))
        await r.upstream.infer_texts("minilm", ["hi"], request_id="r1",
                                     deadline=r.clock() + 2, tenant="acme")
        await r.upstream.infer_texts("minilm", ["hi"], request_id="r2",
                                     deadline=r.clock() + 2, tenant="acme", priority=BATCH)
        await r.upstream.infer_raw("minilm", forged, request_id="r3", deadline=r.clock() + 2,
                                   tenant="acme")
        interactive, batch, raw = sent_parameters(r)
        # Only an interactive call of a tenant without a backlog here, and only with express.
        assert interactive.get("express") is (True if express else None)
        assert "express" not in batch
        assert raw.get("express") is (True if express else None) and raw["custom"] == 1


def test_fairness_keys_are_stable_opaque_and_salted() -> None:
    assert fairness_key("acme") == fairness_key("acme") != fairness_key("acme2")
    assert len(fairness_key("acme")) == 24 and "acme" not in fairness_key("acme")
    assert fairness_key("acme", "s3cret") != fairness_key("acme")


def test_the_priority_comes_from_route_then_tenant_then_class_and_may_only_be_lowered() -> None:
    specs = {"gold": TenantSpec(backend_priority=1, route_priority={"/v1/rank": 2}),
             "bulk": TenantSpec(backend_priority=4),
             "night": TenantSpec(priority=BATCH)}

    def lookup(tenant: str) -> tuple[Priority, int | None, dict[str, int]]:
        spec = specs.get(tenant, TenantSpec())
        return spec.priority, spec.backend_priority, dict(spec.route_priority)

    schedule = Schedule(interactive=2, batch=5, tenant_priority=lookup)
    assert schedule.priority("anyone", "/v1/embeddings", INTERACTIVE) == 2
    assert schedule.priority("gold", "/v1/embeddings", INTERACTIVE) == 1
    assert schedule.priority("gold", "/v1/rank", INTERACTIVE) == 2
    assert schedule.priority("bulk", "/v1/embeddings", INTERACTIVE) == 4
    assert schedule.priority("gold", "/v1/embeddings", BATCH) == 5  # batch never above 5
    assert schedule.priority("gold", "/v1/embeddings", INTERACTIVE, client=1) == 1
    assert schedule.priority("anyone", "/v1/embeddings", INTERACTIVE, client=1) == 2
    assert schedule.priority("anyone", "/v1/embeddings", INTERACTIVE, client=7) == 7
    assert schedule.priority("night", "/v1/embeddings", INTERACTIVE) == 5  # a batch tenant


def test_the_tenants_file_fields_are_checked() -> None:
    problems: list[tuple[list[str | int], str]] = []
    spec = parse_spec({"backend_priority": 2, "route_priority": {"/v1/rank": 3}}, ["t"],
                      TenantSpec(), lambda at, why: problems.append((at, why)))
    assert spec.backend_priority == 2 and spec.route_priority == {"/v1/rank": 3}
    assert not problems
    for bad in ({"backend_priority": 0}, {"backend_priority": "high"},
                {"route_priority": {"/v1/rank": -1}}, {"route_priority": [1]}):
        problems.clear()
        parse_spec(bad, ["t"], TenantSpec(), lambda at, why: problems.append((at, why)))
        assert problems, bad


@pytest.mark.parametrize(("parameters", "want"), [
    (None, (0, None)), ({"priority": 3}, (3, None)), ({"timeout": 250_000}, (0, 0.25)),
    ({"timeout": 0}, (0, None)), ({"priority": True, "timeout": -5}, (0, None)),
])
def test_a_clients_own_schedule_is_read_leniently(parameters: object, want: object) -> None:
    assert client_schedule(parameters) == want
