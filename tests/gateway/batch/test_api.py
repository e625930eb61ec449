"""The Files and Batches API through the official ``openai`` client, against a real gateway
process (real Redis, real backend): upload, create, poll, download; answers equal to the
interactive routes'; cancel; list; tenant isolation; bad lines and limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from bench.services import Server
from tests.gateway.batch.conftest import (
    KEYS,
    Gateways,
    client,
    embedding_lines,
    jsonl,
    read_lines,
    wait_finished,
)

TEXTS = [f"batch text number {i}: how do I reset my password?" for i in range(12)]


@pytest.fixture(scope="module")
def server(gateways: Gateways) -> Iterator[Server]:
    yield gateways.start(max_file_bytes=64 * 1024, max_lines=100, max_line_bytes=4096,
                         max_active_batches=2, max_stored_bytes=4 * 1024 * 1024)


def interactive(server: Server, route: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{server.url}{route}", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEYS['acme']}"})
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def run(api: openai.OpenAI, rows: list[dict[str, Any]], endpoint: str = "/v1/embeddings",
        ) -> Any:
    upload = api.files.create(file=("input.jsonl", jsonl(rows)), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint=endpoint,  # type: ignore[arg-type]
                               completion_window="24h", metadata={"job": "test"})
    assert batch.status in ("validating", "in_progress")
    return wait_finished(api, batch.id)


def test_a_batch_answers_every_line_as_the_interactive_route_does(server: Server) -> None:
    api = client(server)
    rows = embedding_lines(TEXTS)
    rows.append({"custom_id": "classify-wrong-url", "method": "POST", "url": "/v1/classify",
                 "body": {"model": "minilm", "input": "x", "labels": ["a", "b"]}})
    done = run(api, rows)
    assert done.status == "completed", done
    assert done.request_counts.total == len(rows)
    assert (done.request_counts.completed, done.request_counts.failed) == (len(TEXTS), 1)
    assert done.metadata == {"job": "test"}
    out = read_lines(api, done.output_file_id)
    assert [line["custom_id"] for line in out] == [r["custom_id"] for r in rows[:-1]]
    for row, line in zip(rows, out, strict=False):
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["body"] == interactive(server, "/v1/embeddings", row["body"])
    errors = read_lines(api, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["classify-wrong-url"]
    assert errors[0]["error"]["code"] == "invalid_request_line"
    assert "/v1/embeddings" in errors[0]["error"]["message"]
    stats = httpx.get(f"{server.url}/dashboard/stats.json", timeout=10).json()["batch"]
    assert stats["lines"]["completed"] >= len(TEXTS) and stats["lines"]["failed"] >= 1
    assert stats["finished"]["completed"] >= 1


@pytest.mark.parametrize(("endpoint", "body"), [
    ("/v1/classify", {"model": "minilm", "input": ["I cannot log in", "refund please"],
                      "labels": ["billing", "account access"]}),
    ("/v1/rank", {"model": "minilm", "query": "reset password",
                  "documents": ["How to reset a password", "Opening hours", "Refunds"]}),
])
def test_classify_and_rank_batches(server: Server, endpoint: str, body: dict[str, Any]) -> None:
    api = client(server)
    rows = [{"custom_id": "only", "method": "POST", "url": endpoint, "body": body}]
    done = run(api, rows, endpoint)
    assert done.status == "completed"
    (line,) = read_lines(api, done.output_file_id)
    assert line["response"]["body"] == interactive(server, endpoint, body)


def test_bad_lines_become_error_lines_and_never_fail_the_batch(server: Server) -> None:
    api = client(server)
    good = embedding_lines(["a fine line"], prefix="good")
    raw = (b'{"custom_id": "good-0", "method": "POST", "url": "/v1/embeddings", '
           b'"body": {"model": "minilm", "input": "a fine line"}}\n'
           b"{not json at all\n"
           b"\n"
           b'["an", "array"]\n'
           b'{"custom_id": "no-model", "method": "POST", "url": "/v1/embeddings", '
           b'"body": {"input": "x"}}\n'
           b'{"custom_id": "bad-model", "method": "POST", "url": "/v1/embeddings", '
           b'"body": {"model": "nope", "input": "x"}}\n'
           b'{"custom_id": "get", "method": "GET", "url": "/v1/embeddings", "body": {}}\n')
    upload = api.files.create(file=("mixed.jsonl", raw), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                               completion_window="24h")
    done = wait_finished(api, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (6, 1, 5)
    (ok,) = read_lines(api, done.output_file_id)
    assert ok["custom_id"] == good[0]["custom_id"]
    errors = {(e["custom_id"], (e["error"] or {}).get("line")): e
              for e in read_lines(api, done.error_file_id)}
    assert set(errors) == {(None, 2), (None, 4), ("no-model", None), ("bad-model", None),
                           ("get", 7)}
    assert errors[("no-model", None)]["response"]["status_code"] == 422
    assert errors[("no-model", None)]["response"]["body"]["error"]["type"] == "invalid_request"
    assert errors[("bad-model", None)]["response"]["status_code"] == 404
    assert "line 2" in errors[(None, 2)]["error"]["message"]


def test_cancel_keeps_answered_lines_and_accounts_for_every_line(server: Server) -> None:
    api = client(server)
    rows = embedding_lines([f"cancel me {i}" for i in range(100)], prefix="c")
    upload = api.files.create(file=("cancel.jsonl", jsonl(rows)), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                               completion_window="24h")
    cancelling = api.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled", "completed")
    done = wait_finished(api, batch.id)
    if done.status == "completed":
        pytest.fail("the batch finished before the cancel: make it longer")
    assert done.status == "cancelled" and done.cancelled_at is not None
    lines = read_lines(api, done.output_file_id) + read_lines(api, done.error_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(r["custom_id"] for r in rows)
    skipped = [line for line in lines if line["error"] is not None]
    assert all(line["error"]["code"] == "batch_cancelled" for line in skipped)
    assert done.request_counts.completed + done.request_counts.failed == len(rows)
    with pytest.raises(openai.ConflictError):
        api.batches.cancel(run(api, embedding_lines(["short"])).id)


def test_list_pages_through_the_tenants_own_batches(server: Server) -> None:
    api = client(server)
    upload = api.files.create(file=("l.jsonl", jsonl(embedding_lines(["list me"]))),
                              purpose="batch")
    made = []
    for _ in range(3):
        batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                   completion_window="24h")
        made.append(batch.id)
        wait_finished(api, batch.id)
    first = api.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    seen = [b.id for b in api.batches.list(limit=2)]  # iterating follows the pages
    assert seen[:3] == made[::-1] and len(seen) == len(set(seen))
    other = client(server, "globex")
    assert all(b.id not in made for b in other.batches.list(limit=100).data)


def test_another_tenants_ids_are_not_found(server: Server) -> None:
    acme, globex = client(server, "acme"), client(server, "globex")
    upload = acme.files.create(file=("mine.jsonl", jsonl(embedding_lines(["mine"]))),
                               purpose="batch")
    batch = acme.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                completion_window="24h")
    for attempt in (lambda: globex.files.retrieve(upload.id),
                    lambda: globex.files.content(upload.id),
                    lambda: globex.files.delete(upload.id),
                    lambda: globex.batches.retrieve(batch.id),
                    lambda: globex.batches.cancel(batch.id),
                    lambda: globex.batches.create(input_file_id=upload.id,
                                                  endpoint="/v1/embeddings",
                                                  completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            attempt()
    done = wait_finished(acme, batch.id)
    with pytest.raises(openai.NotFoundError):
        globex.files.content(done.output_file_id or "")
    assert acme.files.retrieve(upload.id).id == upload.id
    assert acme.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve(upload.id)


def test_limits_are_clear_4xx_at_upload_and_create(server: Server) -> None:
    api = client(server)
    cases = [
        (b'{"custom_id": "x"}\n' * 101, openai.APIStatusError, 413, "batch.max_lines"),
        (b"x" * (65 * 1024), openai.APIStatusError, 413, "batch.max_file_bytes"),
        (b'{"custom_id": "' + b"y" * 5000 + b'"}\n', openai.APIStatusError, 413,
         "batch.max_line_bytes"),
        (b'{"custom_id": "a"}\n{"custom_id": "a"}\n', openai.UnprocessableEntityError, 422,
         "repeats the custom_id"),
        (b"\n\n", openai.UnprocessableEntityError, 422, "has no requests"),
    ]
    for data, kind, status, words in cases:
        with pytest.raises(kind) as caught:
            api.files.create(file=("big.jsonl", data), purpose="batch")
        assert caught.value.status_code == status
        assert words in orjson.dumps(caught.value.body).decode()
    upload = api.files.create(file=("ok.jsonl", jsonl(embedding_lines(["ok"]))), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError) as unknown:
        api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    assert "endpoint" in str(unknown.value.body)
    with pytest.raises(openai.UnprocessableEntityError):
        api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                           completion_window="1 day")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        api.batches.create(input_file_id="file-000000000000000000000000",
                           endpoint="/v1/embeddings", completion_window="24h")
    resp = httpx.post(f"{server.url}/v1/files", files={"file": ("a.jsonl", b"{}\n")},
                      data={"purpose": "fine-tune"},
                      headers={"Authorization": f"Bearer {KEYS['acme']}"})
    assert resp.status_code == 422 and resp.json()["error"]["type"] == "invalid_request"
    assert httpx.get(f"{server.url}/v1/batches").status_code == 401


def test_concurrent_batches_and_stored_bytes_per_tenant(server: Server) -> None:
    api = client(server, "globex")
    rows = embedding_lines([f"slow {i}" for i in range(100)], prefix="s")
    upload = api.files.create(file=("s.jsonl", jsonl(rows)), purpose="batch")
    running = [api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                  completion_window="24h") for _ in range(2)]
    with pytest.raises(openai.ConflictError):  # two unfinished batches read it
        api.files.delete(upload.id)
    with pytest.raises(openai.RateLimitError) as limited:
        api.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    assert "batch.max_active_batches" in str(limited.value.body)
    for batch in running:
        wait_finished(api, batch.id)
    assert api.files.delete(upload.id).deleted  # both finished: it may go now
    stored = 0
    with pytest.raises(openai.APIStatusError) as full:
        for i in range(200):  # bounded: the 4 MiB quota ends it after some 70 files
            big = b"".join(b'{"custom_id": "q%d", "pad": "%s"}\n' % (j, b"z" * 3900)
                           for j in range(15))
            api.files.create(file=(f"q{i}.jsonl", big), purpose="batch")
            stored += 1
    assert full.value.status_code == 413 and "batch.max_stored_bytes" in str(full.value.body)
    assert stored > 20
