"""Open Inference Protocol v2 (REST) responses: the inference response encoded and the model
metadata object, for the requests oip.py parses.

An output asked for with ``"parameters": {"binary_data": true}`` (or every output, with the
request parameter ``binary_data_output: true``) goes out as raw little-endian bytes after the
JSON part (Triton's binary tensor extension), its size in ``parameters.binary_data_size`` and
the JSON part's size in ``EncodedResponse.json_length``; the others go in the JSON as flat
row-major ``data``. Pure functions: no aiohttp, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from backend.oip import TOKEN_COUNT, TOKEN_COUNT_SPEC, InferRequest
from backend.repository import ModelConfig


@dataclass(frozen=True, slots=True)
class EncodedResponse:
    """An encoded inference response; ``json_length`` is set when binary data follows the JSON
    (the value of the ``Inference-Header-Content-Length`` header)."""

    body: bytes
    json_length: int | None


def encode_infer_response(
    *,
    config: ModelConfig,
    request: InferRequest,
    embeddings: npt.NDArray[np.float32],
    parameters: Mapping[str, float | int | str | bool],
    token_counts: Sequence[int] = (),
) -> EncodedResponse:
    """The inference response: the requested outputs with flat row-major data, in the JSON or,
    for those asked for as binary data, as raw bytes after it."""
    spec = config.output
    tensors: list[tuple[str, str, list[int], npt.NDArray[Any]]] = []
    if request.outputs is None or spec.name in request.outputs:
        tensors.append((spec.name, spec.datatype, list(embeddings.shape),
                        np.ascontiguousarray(embeddings, dtype="<f4").reshape(-1)))
    if token_counts and (request.outputs is None or TOKEN_COUNT in request.outputs):
        tensors.append((TOKEN_COUNT, "INT32", [len(token_counts)],
                        np.asarray(token_counts, dtype="<i4")))
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, datatype, shape, data in tensors:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if request.wants_binary(name):
            raw = data.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = data
        outputs.append(entry)
    response: dict[str, Any] = {"model_name": config.name, "model_version": config.version}
    if request.id is not None:
        response["id"] = request.id
    response["parameters"] = dict(parameters)
    response["outputs"] = outputs
    head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return EncodedResponse(head, None)
    return EncodedResponse(b"".join((head, *chunks)), len(head))


def model_metadata(config: ModelConfig, identity: str = "") -> dict[str, Any]:
    """The model metadata response object; ``identity`` (the served graph's SHA-256) goes in
    ``parameters.model_sha256``, so a gateway can tell different weights under one name and
    version apart (it scopes its node cache by it)."""
    meta: dict[str, Any] = {
        "name": config.name,
        "versions": [config.version],
        "platform": config.platform,
        "inputs": [t.to_json() for t in config.inputs],
        "outputs": [*(t.to_json() for t in config.outputs), TOKEN_COUNT_SPEC],
    }
    if identity:
        meta["parameters"] = {"model_sha256": identity}
    return meta
