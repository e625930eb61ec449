"""The Files/Batches calls the batch benchmark makes (``bench/batch.py``): plain HTTP, as any
client of the gateway's OpenAI-style API would."""

from __future__ import annotations

import time

import httpx
import orjson

from bench.services import Server

ROUTE = "/v1/embeddings"


class BatchClient:
    """The Files/Batches calls the bench makes (plain HTTP, as any client)."""

    def __init__(self, server: Server) -> None:
        self.http = httpx.Client(base_url=f"{server.url}/v1", timeout=60.0)

    def start(self, lines: int, tag: str) -> str:
        data = b"".join(orjson.dumps({
            "custom_id": f"{tag}-{i}", "method": "POST", "url": ROUTE,
            "body": {"model": "minilm", "input": f"batch bench {tag} line {i}"}}) + b"\n"
            for i in range(lines))
        up = self.http.post("/files", files={"file": ("bench.jsonl", data)},
                            data={"purpose": "batch"})
        up.raise_for_status()
        made = self.http.post("/batches", json={"input_file_id": up.json()["id"],
                                                "endpoint": ROUTE, "completion_window": "24h"})
        made.raise_for_status()
        return str(made.json()["id"])

    def get(self, batch_id: str) -> dict[str, object]:
        resp = self.http.get(f"/batches/{batch_id}")
        resp.raise_for_status()
        found: dict[str, object] = resp.json()
        return found

    def done(self, batch_id: str) -> int:
        counts = self.get(batch_id)["request_counts"]
        if not isinstance(counts, dict):
            raise RuntimeError(f"batch {batch_id}: no request_counts in {counts!r}")
        return int(counts["completed"]) + int(counts["failed"])

    def finish(self, batch_id: str, timeout_s: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = self.get(batch_id)
            if batch["status"] in ("completed", "cancelled", "expired", "failed"):
                return batch
            time.sleep(0.5)
        raise RuntimeError(f"batch {batch_id} did not finish in {timeout_s:g} s")

    def output_ids(self, file_id: object) -> list[str]:
        if not isinstance(file_id, str):
            return []
        data = self.http.get(f"/files/{file_id}/content").content
        return [orjson.loads(line)["custom_id"] for line in data.splitlines() if line.strip()]
