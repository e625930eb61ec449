"""Serving the backend app in tests: over a real socket, as ``python -m backend serve`` runs it.

aiohttp's ``TestServer`` cancels a handler whose client disconnects; the CLI's runner
(``backend.server.BackendRunner``, like ``web.run_app``) does not, so a handler there sees the
disconnect as an exception from ``request.read()`` instead. ``DeployedServer`` runs the app
the deployed way, through that runner, so what the tests see is what production does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from backend.app import create_app
from backend.model import Embedding, EmbeddingModel
from backend.server import BackendRunner
from backend.settings import ServeSettings
from backend.tokenizer import IdArray


class DeployedServer(TestServer):
    """``TestServer`` through the CLI's runner, with its handler settings (handlers are not
    cancelled; parser errors answered as JSON)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        kwargs["handler_cancellation"] = False
        return BackendRunner(self.app, **kwargs)


class CountingModel(EmbeddingModel):
    """The real model, counting the texts it tokenizes and the rows it computes."""

    def __init__(self, model: EmbeddingModel) -> None:
        super().__init__(model.config, model.tokenizer, model.runtime)
        self.tokenized = 0
        self.computed = 0

    def tokenize(self, texts: Sequence[str]) -> list[IdArray]:
        self.tokenized += len(texts)
        return super().tokenize(texts)

    def compute(self, seqs: list[IdArray]) -> list[Embedding]:
        self.computed += len(seqs)  # one batcher worker: never two threads at once
        return super().compute(seqs)

    @property
    def calls(self) -> tuple[int, int]:
        return self.tokenized, self.computed


@contextlib.asynccontextmanager
async def serving(models: Sequence[EmbeddingModel], *, wait_ready: bool = True,
                  **overrides: Any) -> AsyncIterator[TestClient[Any, Any]]:
    """A client of a backend app serving ``models`` on 127.0.0.1 (ready unless told not to)."""
    options: dict[str, Any] = {
        "device": "cpu", "warmup_lengths": (8,), "warmup_batch_sizes": (1,),
        "client_max_size": 1024 * 1024, "grpc_port": 0,  # tests that want gRPC pass a port
    }
    options.update(overrides)
    client: TestClient[Any, Any] = TestClient(DeployedServer(
        create_app(ServeSettings(**options), models=models)))
    await client.start_server()
    try:
        if wait_ready:
            for _ in range(600):
                if (await client.get("/v2/health/ready")).status == 200:
                    break
                await asyncio.sleep(0.05)
            else:
                raise TimeoutError("backend never became ready")
        yield client
    finally:
        await client.close()


def infer_body(texts: list[str], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}], **extra}


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def scrape(client: TestClient[Any, Any], name: str, **labels: str) -> float:
    """``metric`` read from the server's ``/metrics`` now."""
    return metric(await (await client.get("/metrics")).text(), name, **labels)
