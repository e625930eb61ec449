"""bench cpu's reading of callgrind dumps (the servers themselves run under valgrind only in the
bench: too slow for the suite)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from prometheus_client.samples import Sample as MetricSample

from bench import cpu, services
from bench.gateway_probe import metric_samples

# A dump as callgrind writes it with --dump-instr=no --collect-jumps=no: name compression,
# relative positions, a call whose inclusive cost must not count as the caller's own.
DUMP = """\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1760

ob=(1) /usr/lib/libpython3.11.so
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
10 100
+2 50
cob=(2) /venv/onnxruntime/capi/onnxruntime_pybind11_state.cpython-311.so
cfi=(2) ???
cfn=(2) 0x0000000000455630
calls=1 0
* 1500
-1 7

ob=(2)
fl=(2)
fn=(2)
0 1500

ob=(3) /usr/lib/libc.so.6
fl=(3) memcpy.S
fn=(3) memcpy
5 3
fn=(4) malloc
fi=(4) inline.h
6 100
totals: 1760
"""


def test_own_instructions_are_summed_per_object_and_a_call_cost_is_not_the_callers() -> None:
    own = cpu.own_by_object(DUMP)
    assert own == {
        "/usr/lib/libpython3.11.so": 157,
        "/venv/onnxruntime/capi/onnxruntime_pybind11_state.cpython-311.so": 1500,
        "/usr/lib/libc.so.6": 103,
    }
    assert sum(own.values()) == 1760  # every instruction once: the totals line


def test_totals_and_a_dump_still_being_written(tmp_path: Path) -> None:
    done = tmp_path / "cg.1.1"
    done.write_text(DUMP)
    assert cpu.totals(done) == 1760
    partial = tmp_path / "cg.1.2"
    partial.write_text(DUMP.split("summary:")[0])
    with pytest.raises(ValueError):
        cpu.totals(partial)


def test_the_backend_floor_case_is_known_and_leaves_out_onnx_runtime() -> None:
    assert "backend_floor" in cpu.CASES
    assert cpu.ORT_OBJECT in "/venv/onnxruntime/capi/onnxruntime_pybind11_state.cpython-311.so"


def test_the_refused_case_is_a_refusal_judged_before_the_policy_and_lookups() -> None:
    """The ``refused`` case's set-up, without valgrind: with one call in the only slot and one
    waiting, each new request of the tenant is refused at once (503, the full queue) by the
    early judgement, so it never reaches the policy (its decisions stay at the two held
    calls') nor the cache lookups."""
    backend = services.slow_backend(cores=None, slots=1, service_ms=cpu._HOLD_MS)
    try:
        metrics = _refusals(backend)
    finally:
        backend.stop()
    decisions = sum(s.value for s in metrics if s.name == "gateway_policy_decisions_total")
    assert decisions == 2.0  # the held calls only
    shed = {s.labels["reason"]: s.value for s in metrics if s.name == "gateway_shed_total"}
    assert shed.get("queue_full") == 3.0
    lookups = sum(s.value for s in metrics
                  if s.name == "gateway_cache_lookups_total" and s.labels["tier"] == "l1")
    assert lookups == 2.0  # the held calls' texts only


def _refusals(backend: services.Server) -> list[MetricSample]:
    """Three refused requests behind two held calls; the gateway's /metrics after them (the
    backend is stopped before the gateway, so the held calls end and the gateway stops at
    once)."""
    with services.gateway(backend.url, cores=None, settings=cpu.REFUSED_SETTINGS) as gateway:
        client = cpu.Client(gateway.port)
        held = cpu.hold_calls(client, gateway.port, wait_s=5.0)  # in the slot, and queued
        try:
            for i in range(3):
                status, headers, body = client.post(
                    "/v1/embeddings", cpu.embeddings_body(f"a refused sentence {i}"))
                assert status == 503 and b"queue" in body and "retry-after" in headers
            return metric_samples(gateway.url, {
                "gateway_policy_decisions_total", "gateway_shed_total",
                "gateway_cache_lookups_total"})
        finally:
            client.close()
            for conn in held:
                conn.close()
            # Killed, not stopped: a graceful stop would wait for the held calls' hour.
            os.kill(backend.service.pid, signal.SIGKILL)
            backend.stop()
