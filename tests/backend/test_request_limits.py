"""The work one request may ask for: texts, bytes of text, tokens (``backend/limits.py``).

Over a real socket with the real model behind a counter: a request past a limit is answered in
the JSON error shape naming the limit and never reaches the tokenizer or the model; a request
exactly at the limits is served.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient

from backend.limits import text_bytes
from backend.model import EmbeddingModel
from tests.backend.serving import CountingModel, infer_body, serving

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

MAX_ITEMS = 8
MAX_TEXT_BYTES = 8 * 4096
OIP = "/v2/models/minilm/infer"


@pytest.fixture(scope="module")
def model(models: list[EmbeddingModel]) -> CountingModel:
    return CountingModel(models[0])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(model: CountingModel) -> AsyncIterator[TestClient[Any, Any]]:
    async with serving([model], max_items_per_request=MAX_ITEMS,
                       max_text_bytes_per_request=MAX_TEXT_BYTES) as started:
        yield started


def oip_binary(texts: list[str]) -> tuple[bytes, dict[str, str]]:
    """An infer request with the texts in Triton's binary BYTES layout (tritonclient's)."""
    data = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    head = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                                     "parameters": {"binary_data_size": len(data)}}]})
    return head + data, {"Inference-Header-Content-Length": str(len(head)),
                         "Content-Type": "application/octet-stream"}


PER_TEXT = MAX_TEXT_BYTES // MAX_ITEMS
AT_LIMIT = [("the quick brown fox jumps over the lazy dog " * 100)[:PER_TEXT]] * MAX_ITEMS
ONE_BYTE_OVER = [*AT_LIMIT[:-1], AT_LIMIT[-1] + "y"]
# As many characters as AT_LIMIT, but "é" is two bytes in UTF-8: bytes are what count.
TWO_BYTE = ["é" * PER_TEXT] * MAX_ITEMS


@pytest.mark.parametrize(
    ("route", "texts", "status", "message"),
    [
        ("oip", ONE_BYTE_OVER, 413, "max_text_bytes_per_request"),
        ("oip", TWO_BYTE, 413, f"texts of {2 * MAX_TEXT_BYTES} bytes"),
        ("binary", ONE_BYTE_OVER, 413, "max_text_bytes_per_request"),
        ("openai", ONE_BYTE_OVER, 413, "max_text_bytes_per_request"),
        ("oip", ["short"] * (MAX_ITEMS + 1), 400, f"at most {MAX_ITEMS} per request"),
        ("openai", ["short"] * (MAX_ITEMS + 1), 400, f"at most {MAX_ITEMS} per request"),
    ],
)
async def test_request_past_a_limit_is_refused_before_the_model(
    client: TestClient[Any, Any], model: CountingModel, route: str, texts: list[str],
    status: int, message: str,
) -> None:
    calls = model.calls
    if route == "openai":
        response = await client.post("/v1/embeddings", json={"model": "minilm", "input": texts})
    elif route == "binary":
        body, headers = oip_binary(texts)
        response = await client.post(OIP, data=body, headers=headers)
    else:
        response = await client.post(OIP, json=infer_body(texts))
    assert response.status == status
    error = (await response.json())["error"]
    text = error["message"] if route == "openai" else error
    assert message in text, text
    assert model.calls == calls  # neither tokenized nor computed


async def test_request_at_the_limits_is_served_and_each_text_truncated(
    client: TestClient[Any, Any], model: CountingModel,
) -> None:
    assert text_bytes(AT_LIMIT) == MAX_TEXT_BYTES
    tokenized, computed = model.calls
    response = await client.post(OIP, json=infer_body(AT_LIMIT))
    assert response.status == 200, await response.text()
    answer = await response.json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["embedding"]["shape"] == [MAX_ITEMS, 384]
    # Each 4 KiB text is cut to the model's max_seq_length: that caps a request's tokens.
    max_seq = model.config.max_seq_length
    assert outputs["token_count"]["data"] == [max_seq] * MAX_ITEMS
    assert model.calls == (tokenized + MAX_ITEMS, computed + MAX_ITEMS)
    openai = await client.post("/v1/embeddings", json={
        "model": "minilm", "input": AT_LIMIT, "encoding_format": "base64"})
    assert openai.status == 200
    body = await openai.json()
    assert body["usage"]["prompt_tokens"] == max_seq * MAX_ITEMS
    first = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(first, outputs["embedding"]["data"][:384], atol=1e-5)
