"""OpenAI-compatible ``POST /v1/embeddings`` bodies: requests parsed, responses encoded.

Request: ``{"model", "input": str | [str], "encoding_format"?: "float" | "base64",
"dimensions"?, "user"?}``. Response: ``{"object": "list", "data": [{"object": "embedding",
"index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}`` where base64 is
the little-endian float32 bytes of each vector (what the OpenAI clients decode) and token counts
are the real ones, special tokens included. Errors use OpenAI's error object (the middleware).

Pure functions: no aiohttp, no I/O. Every rule broken raises ``BadRequest``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from backend.envelope import decode_json, whole
from backend.errors import BadRequest

EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A validated embeddings request."""

    model: str
    texts: list[str]
    encoding_format: EncodingFormat
    dimensions: int | None


def parse_embeddings_request(body: bytes, *, max_items: int) -> EmbeddingsRequest:
    """Parses and validates the request body."""
    raw = decode_json(body)
    if not isinstance(raw, dict):
        raise BadRequest("the request body must be a JSON object")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string")
    texts = _parse_input(raw.get("input"), max_items)
    encoding: EncodingFormat
    match raw.get("encoding_format"):
        case None | "float":
            encoding = "float"
        case "base64":
            encoding = "base64"
        case _:
            raise BadRequest("'encoding_format' must be 'float' or 'base64'")
    dimensions = whole(raw.get("dimensions"))
    if "dimensions" in raw and (dimensions is None or dimensions < 1):
        raise BadRequest("'dimensions' must be a positive integer")
    if "user" in raw and not isinstance(raw["user"], str):
        raise BadRequest("'user' must be a string")
    return EmbeddingsRequest(model, texts, encoding, dimensions)


def _parse_input(value: Any, max_items: int) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a string or a non-empty list of strings")
    if not all(isinstance(item, str) for item in value):
        if all(isinstance(item, int | list) for item in value):
            raise BadRequest("'input' as token ids is not supported; send text")
        raise BadRequest("'input' must be a string or a non-empty list of strings")
    if len(value) > max_items:
        raise BadRequest(f"too many items: {len(value)} texts; at most {max_items} per request")
    return value


def encode_embeddings_response(
    *,
    model: str,
    embeddings: npt.NDArray[np.float32],
    token_counts: Sequence[int],
    encoding_format: EncodingFormat,
) -> bytes:
    """The response body."""
    rows = np.ascontiguousarray(embeddings, dtype="<f4")
    data: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        vector: Any = base64.b64encode(row.tobytes()).decode("ascii") \
            if encoding_format == "base64" else row
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = int(sum(token_counts))
    return orjson.dumps(
        {"object": "list", "data": data, "model": model,
         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
