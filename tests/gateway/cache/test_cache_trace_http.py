"""The trace recorder switched on in a real gateway: what it writes, and that the bench replays
it (issue 27)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench import hittraces
from gateway.cache.tracefile import read_trace
from tests.gateway.conftest import BackendProc, GatewayFactory

TEXTS = ["recorded sentence one, quite private", "recorded sentence two", "another text"]


async def test_a_gateway_records_hashes_only_and_the_bench_replays_it(
        gateway: GatewayFactory, backend: BackendProc, tmp_path: Path) -> None:
    base = tmp_path / "trace.bin"
    client: Any = await gateway(cache={"trace": {"enabled": True, "path": str(base)}})
    for _ in range(3):  # a miss, a full-path hit, then hot answers
        for text in TEXTS:
            resp = await client.post("/v1/embeddings", json={"model": "minilm", "input": text})
            assert resp.status == 200
    await client.close()  # the app's cleanup writes what is queued
    path = Path(f"{base}.{os.getpid()}")
    data = path.read_bytes()  # noqa: ASYNC240 (a test, after the server closed)
    for text in TEXTS:
        for word in text.split():
            assert word.encode() not in data
    records = read_trace(str(path))
    assert len(records) == 9  # one lookup per text per request, hot answers included
    assert len({r.key for r in records}) == 3
    assert all(r.size > 0 for r in records)  # from the stores and the hits
    trace = hittraces.recorded(str(path))
    assert trace.universe == 3 and len(trace.keys) == 9
