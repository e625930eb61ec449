"""Batch lines and the tenants' quotas, against a real gateway process (real Redis, real
backend): a line is charged like an interactive call, waits for its quota within the window,
or ends as a ``quota_exceeded`` error line; it is never computed free."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.services import Server
from gateway.tenants.directory import key_digest
from tests.gateway.batch.conftest import (
    Gateways,
    PersistentRedis,
    jsonl,
    read_lines,
    wait_finished,
)
from tests.gateway.conftest import BackendProc

KEYS = {"thrifty": "thrifty-batch-quota-key-01", "metered": "metered-batch-quota-key-02"}
TENANTS = f"""
tenants:
  thrifty:
    api_keys_sha256: ["{key_digest(KEYS['thrifty'])}"]
    quota: {{texts_per_day: 5}}
  metered:
    api_keys_sha256: ["{key_digest(KEYS['metered'])}"]
    quota: {{texts_per_s: 2, texts_burst: 4}}
"""


@pytest.fixture(scope="module")
def server(backend: BackendProc, batch_redis: PersistentRedis,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tenants = tmp_path_factory.mktemp("quota-tenants") / "tenants.yaml"
    tenants.write_text(TENANTS, encoding="utf-8")
    found = Gateways(backend, batch_redis, tenants, Path(tmp_path_factory.mktemp("quota-gw")))
    try:
        yield found.start()
    finally:
        found.stop_all()


def api(server: Server, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0,
                         timeout=30.0)


def embed(server: Server, tenant: str, texts: list[str]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", timeout=30,
                      json={"model": "minilm", "input": texts},
                      headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def counter(server: Server, name: str, **labels: str) -> float:
    """A counter's value in the gateway's /metrics (0 when the series does not exist yet)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def submit(client: openai.OpenAI, rows: list[dict[str, object]], window: str = "24h") -> str:
    upload = client.files.create(file=("input.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                  completion_window=window)  # type: ignore[arg-type]
    return batch.id


def lines(prefix: str, n: int, per_line: int) -> list[dict[str, object]]:
    return [{"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "minilm",
                      "input": [f"{prefix} line {i} text {j}: where is my parcel?"
                                for j in range(per_line)]}} for i in range(n)]


def test_a_spent_daily_budget_is_not_computed_free_by_a_batch(
        server: Server, backend: BackendProc) -> None:
    cached = [f"thrifty interactive text {i}" for i in range(5)]
    assert embed(server, "thrifty", cached).status_code == 200  # the whole day's budget
    refused = embed(server, "thrifty", ["one more text"])
    assert refused.status_code == 429, refused.text
    calls_before = backend.requests_total()

    rows = lines("thrifty", 40, 10)
    # A cached text costs quotas.hit_cost (0 by default) in a batch as interactively.
    rows.append({"custom_id": "cached", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "minilm", "input": cached[0]}})
    client = api(server, "thrifty")
    done = wait_finished(client, submit(client, rows), timeout_s=90)

    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 40)
    out = read_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == ["cached"]
    errors = read_lines(client, done.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == sorted(f"thrifty-{i}" for i in range(40))
    for error in errors:  # OpenAI's shape for a line that never got a response
        assert error["response"] is None
        assert error["error"]["code"] == "quota_exceeded"
        assert "5 texts per UTC day" in error["error"]["message"]
    assert backend.requests_total() == calls_before  # nothing was computed
    assert embed(server, "thrifty", ["one more text"]).status_code == 429
    assert embed(server, "thrifty", [cached[0]]).status_code == 200  # a hit, as in the batch
    assert counter(server, "gateway_tenant_texts_total", tenant="thrifty",
                   source="backend") == 5
    assert counter(server, "gateway_batch_lines_total", outcome="quota_fail") == 40


def test_a_rate_limited_batch_waits_for_its_quota_and_is_charged(server: Server) -> None:
    client = api(server, "metered")
    rows = lines("metered", 8, 2)  # 16 texts at 2 per second after a burst of 4: >= 6 s
    started = time.monotonic()
    done = wait_finished(client, submit(client, rows), timeout_s=120)
    elapsed = time.monotonic() - started

    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (8, 0)
    assert elapsed >= 5.0, f"16 texts at 2/s (burst 4) answered in {elapsed:.1f} s"
    assert counter(server, "gateway_tenant_texts_total", tenant="metered",
                   source="backend") == 16
    deferred = counter(server, "gateway_batch_lines_total", outcome="quota_defer")
    assert deferred > 0  # parked off the worker (retry_max_s is 0.5 s here)
    assert deferred + counter(server, "gateway_batch_lines_total",
                              outcome="quota_sleep") < 100  # waited, not polled
