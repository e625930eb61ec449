"""OpenAI-compatible embeddings request parsing and response encoding (pure)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from backend.errors import BadRequest
from backend.openai import encode_embeddings_response, parse_embeddings_request


def parse(body: Any, max_items: int = 4) -> Any:
    return parse_embeddings_request(orjson.dumps(body), max_items=max_items)


def test_string_and_list_inputs() -> None:
    one = parse({"model": "minilm", "input": "hi"})
    assert (one.model, one.texts, one.encoding_format) == ("minilm", ["hi"], "float")
    many = parse({"model": "minilm", "input": ["a", "b"], "encoding_format": "base64"})
    assert (many.texts, many.encoding_format) == (["a", "b"], "base64")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": "hi"}, "'model' is required"),
        ({"model": "minilm"}, "'input' must be"),
        ({"model": "minilm", "input": []}, "'input' must be"),
        ({"model": "minilm", "input": [1, 2, 3]}, "token ids is not supported"),
        ({"model": "minilm", "input": ["a", 2]}, "'input' must be"),
        ({"model": "minilm", "input": ["a"] * 5}, "too many items: 5"),
        ({"model": "minilm", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "minilm", "input": "a", "dimensions": 0}, "dimensions"),
    ],
)
def test_bad_requests(body: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse(body)


def test_float_and_base64_responses_carry_the_same_vectors() -> None:
    embeddings = np.array([[0.5, -0.25, 1.0], [0.0, 0.125, -1.0]], dtype=np.float32)
    plain = orjson.loads(encode_embeddings_response(
        model="minilm", embeddings=embeddings, token_counts=[3, 4], encoding_format="float"))
    packed = orjson.loads(encode_embeddings_response(
        model="minilm", embeddings=embeddings, token_counts=[3, 4], encoding_format="base64"))
    assert plain["object"] == "list" and plain["model"] == "minilm"
    assert plain["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in plain["data"]] == [0, 1]
    assert plain["data"][1] == {"object": "embedding", "index": 1,
                                "embedding": [0.0, 0.125, -1.0]}
    for row, item in zip(embeddings, packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, row)


@pytest.mark.parametrize("body", [
    b'{"model": "minilm", "input": "x", "user": true}',
    b'{"model": "minilm", "input": "x", "user": null}',
    b'{"model": "minilm", "input": "x", "dimensions": null}',
])
def test_fields_of_the_wrong_type_are_400(body: bytes) -> None:
    """Found by the API fuzzer: these were answered 200."""
    with pytest.raises(BadRequest):
        parse_embeddings_request(body, max_items=8)
