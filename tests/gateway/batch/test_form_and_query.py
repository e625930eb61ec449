"""The batch API's query numbers and multipart forms (issue 20, items 4 and 12): ``limit`` in
ASCII digits only (422 otherwise, never a 500), and upload forms with parts besides ``purpose``
and ``file`` are accepted, the extra parts ignored but counted toward the size limit."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.services import Server
from tests.gateway.batch.conftest import KEYS, Gateways, embedding_lines, jsonl

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(gateways: Gateways) -> Iterator[Server]:
    yield gateways.start(max_file_bytes=LIMIT)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS['acme']}"}


@pytest.mark.parametrize("limit", ["²", "\uff15", "٣", "1_0", "+5", " 5", "0", "101", "1.0"])
def test_a_limit_outside_ascii_1_to_100_is_422(server: Server, limit: str) -> None:
    resp = httpx.get(f"{server.url}/v1/batches", params={"limit": limit}, headers=auth())
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["type"] == "invalid_request"
    assert "limit" in resp.json()["error"]["message"]


def test_an_ascii_limit_is_taken(server: Server) -> None:
    resp = httpx.get(f"{server.url}/v1/batches", params={"limit": "5"}, headers=auth())
    assert resp.status_code == 200, resp.text


def upload(server: Server, files: list[tuple[str, tuple[str | None, bytes]]]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/files", files=files, headers=auth(), timeout=30)


def test_extra_form_parts_are_ignored(server: Server) -> None:
    data = jsonl(embedding_lines(["one", "two"]))
    resp = upload(server, [("note", (None, b"x" * 8000)), ("purpose", (None, b"batch")),
                           ("Ð»", (None, b"-1.2e+16")), ("file", ("in.jsonl", data)),
                           ("another", ("more.bin", b"\x00\xff" * 100))])
    assert resp.status_code == 200, resp.text
    assert resp.json()["bytes"] == len(data)


def test_extra_parts_count_toward_the_limit(server: Server) -> None:
    data = jsonl(embedding_lines(["one"]))
    resp = upload(server, [("purpose", (None, b"batch")), ("file", ("in.jsonl", data)),
                           *[(f"pad{i}", (None, b"p" * (LIMIT // 4))) for i in range(6)]])
    assert resp.status_code == 413, resp.text
