"""Crashes mid-batch: a gateway process killed with SIGKILL while it holds queue entries, Redis
itself killed and restarted, and no backend at all for a while. Each time the batch completes
with every input line exactly once in its output and error files, and none failed for it.

The two gateway processes of the crash test keep file contents in one shared directory
(``batch.storage_dir``), as processes on one host (or a shared volume) would."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import redis.asyncio as aioredis

from bench.services import Server
from gateway.batch.jobs import JobStore
from gateway.batch.keys import Keys, new_batch_id
from gateway.settings.batch import BatchSettings
from tests.conftest import free_port
from tests.gateway.batch.conftest import (
    Gateways,
    PersistentRedis,
    client,
    embedding_lines,
    jsonl,
    read_lines,
    wait_finished,
)
from tests.gateway.conftest import metric_value, start_backend, stop_process

LINES = 40
# Slow enough per line (several long texts) that the batch is still running when we strike.
SENTENCE = ("the quick brown fox jumps over the lazy dog while a patient gateway keeps every "
            "interactive answer fast and lets heavy work wait for spare capacity")


def heavy_rows(tag: str) -> list[dict[str, Any]]:
    rows = []
    for i in range(LINES):
        texts = [f"{tag}-{i}-{j} " + " ".join([SENTENCE] * 3) for j in range(3)]
        rows.append({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "minilm", "input": texts}})
    return rows


def start_batch(api: openai.OpenAI, rows: list[dict[str, Any]]) -> str:
    upload = api.files.create(file=("heavy.jsonl", jsonl(rows)), purpose="batch")
    return api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                              completion_window="24h").id


def assert_each_line_once(api: openai.OpenAI, batch_id: str, rows: list[dict[str, Any]]) -> None:
    done = wait_finished(api, batch_id, timeout_s=90)
    assert done.status == "completed", done
    lines = read_lines(api, done.output_file_id) + read_lines(api, done.error_file_id)
    ids = [line["custom_id"] for line in lines]
    assert len(ids) == len(set(ids)) == len(rows), (len(ids), len(set(ids)))
    assert set(ids) == {r["custom_id"] for r in rows}
    assert done.request_counts.completed == len(rows) and done.request_counts.failed == 0


def pending_of(redis: PersistentRedis, pid: int) -> int:
    """Queue entries a gateway process (by PID) holds unacknowledged."""
    found = redis.client().xpending("gw:v1-batch:queue", "workers")
    return sum(int(c["pending"]) for c in found.get("consumers", [])
               if c["name"].decode().split(":")[1] == str(pid))


def test_a_killed_worker_process_has_its_lines_taken_over(gateways: Gateways,
                                                         tmp_path: Path) -> None:
    shared = str(tmp_path / "files")
    first: Server = gateways.start(concurrency=2, chunk_lines=4, storage_dir=shared)
    second: Server = gateways.start(concurrency=2, chunk_lines=4, storage_dir=shared)
    api = client(second)
    rows = heavy_rows(f"crash-{secrets.token_hex(4)}")
    batch_id = start_batch(api, rows)
    victim = first.service.pid
    deadline = time.monotonic() + 30
    while pending_of(gateways.redis, victim) == 0:  # strike while it holds entries
        assert time.monotonic() < deadline, "the first gateway never took an entry"
        time.sleep(0.02)
    before = api.batches.retrieve(batch_id)
    os.kill(victim, signal.SIGKILL)
    assert before.status == "in_progress"
    assert before.request_counts.completed < LINES
    assert_each_line_once(api, batch_id, rows)
    assert pending_of(gateways.redis, victim) == 0  # its entries were claimed and acknowledged
    # The input and the output file in the shared directory (no error file: nothing failed)...
    assert len(list(Path(shared).iterdir())) == 2
    assert not gateways.redis.client().keys("*:data")  # ...and no contents in Redis
    gateways.stop_all()  # every process sharing a batch Redis must share its storage too


def test_a_batch_resumes_after_redis_restarts(gateways: Gateways) -> None:
    server = gateways.start(concurrency=2, chunk_lines=4)
    api = client(server)
    rows = heavy_rows(f"restart-{secrets.token_hex(4)}")
    batch_id = start_batch(api, rows)
    deadline = time.monotonic() + 30
    while api.batches.retrieve(batch_id).request_counts.completed < 5:
        assert time.monotonic() < deadline, "the batch made no progress"
        time.sleep(0.05)
    gateways.redis.kill()
    try:
        with_redis_down = api.batches.retrieve  # the routes answer 503 meanwhile
        try:
            with_redis_down(batch_id)
            raise AssertionError("a batch read while Redis is down should fail")
        except openai.InternalServerError as exc:
            assert exc.status_code == 503
        time.sleep(1.0)
    finally:
        gateways.redis.start()
    middle = api.batches.retrieve(batch_id)
    assert middle.status == "in_progress" and middle.request_counts.completed < LINES
    assert_each_line_once(api, batch_id, rows)
    gateways.stop_all()


def test_a_batch_waits_for_a_backend_and_never_fails_for_its_absence(
        gateways: Gateways, models_dir: Path) -> None:
    gateways.stop_all()  # this gateway alone, so no other one runs the lines
    port = free_port()
    server = gateways.start(concurrency=2, chunk_lines=4,
                            backend_url=f"http://127.0.0.1:{port}")
    api = client(server)
    rows = embedding_lines([f"no backend yet {secrets.token_hex(4)} {i}" for i in range(12)])
    upload = api.files.create(file=("wait.jsonl", jsonl(rows)), purpose="batch")
    batch_id = api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                  completion_window="24h").id
    time.sleep(2.0)  # lines meet connection refusals, then a backend marked down
    waiting = api.batches.retrieve(batch_id)
    assert waiting.status == "in_progress"
    assert (waiting.request_counts.completed, waiting.request_counts.failed) == (0, 0)
    backend = start_backend(models_dir, port=port)
    try:
        done = wait_finished(api, batch_id, timeout_s=90)
    finally:
        stop_process(backend.proc)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (len(rows), 0)
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    held = (metric_value(text, "gateway_batch_lines_total", outcome="retried")
            + metric_value(text, "gateway_batch_deferred_total", reason="no_backend"))
    assert held > 0


async def test_one_finalizer_at_a_time(batch_redis: PersistentRedis) -> None:
    """A finalize entry delivered twice (a retried XADD, a take-over) finds the batch locked:
    the second finalizer steps back instead of interleaving its writes with the first's."""
    client = aioredis.Redis.from_url(batch_redis.url)
    try:
        jobs = JobStore(client, Keys("gw:test-lock"), BatchSettings())
        batch_id = new_batch_id()
        assert await jobs.lock(batch_id, "worker-a", 5.0)
        assert await jobs.lock(batch_id, "worker-a", 5.0)  # its owner extends it
        assert not await jobs.lock(batch_id, "worker-b", 5.0)
        await client.delete(Keys("gw:test-lock").finalizing(batch_id))  # released
        assert await jobs.lock(batch_id, "worker-b", 5.0)
    finally:
        await client.aclose()
