"""A gRPC ``ModelInferResponse`` as the REST answer a backend would give (pure: no grpc, no I/O).

The answer side of the infer translation in grpc_wire.py (which turns the REST request into the
call and renders the other methods' answers): ``infer_reply`` renders the outputs in Triton's
binary layout (``Inference-Header-Content-Length``) or as JSON with ``data``, as ``Render``
asks, and raises ``MalformedAnswer`` when the message's raw data does not fit its tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import orjson
from multidict import CIMultiDictProxy

from gateway.upstream.grpc_wire import (
    _RAW_DTYPES,
    BINARY_HEADER,
    Render,
    raw_tensor,
    trailers,
)
from gateway.upstream.transport import Reply, TransportError
from oip import inference_pb2 as pb

_CONTENTS = {  # datatype -> the typed field of InferTensorContents that holds it
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

class MalformedAnswer(TransportError):
    """The backend's message does not hold together (raw data that does not fit its tensor)."""


def _parameters(source: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, param in source.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is not None:
            found[key] = getattr(param, choice)
    return found


def infer_reply(response: pb.ModelInferResponse, render: Render,
                trailing: Iterable[tuple[str, Any]]) -> Reply:
    """A ``ModelInferResponse`` as a REST backend answers it (see the module doc)."""
    doc: dict[str, Any] = {"model_name": response.model_name,
                           "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = _parameters(response.parameters)
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise MalformedAnswer(f"{len(raw)} raw outputs for {len(response.outputs)} outputs")
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for index, tensor in enumerate(response.outputs):
        shape = list(tensor.shape)
        out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": shape}
        params = _parameters(tensor.parameters)
        data = raw[index] if raw else None
        if render.is_binary(tensor.name):
            blob = data if data is not None else _contents_raw(tensor)
            _check_size(tensor.datatype, shape, blob)
            params["binary_data_size"] = len(blob)
            blobs.append(blob)
        else:
            out["data"] = _json_data(tensor, data, shape)
        if params:
            out["parameters"] = params
        outputs.append(out)
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = trailers(trailing)
    if not blobs:
        headers["Content-Type"] = "application/json"
        return Reply(200, header, CIMultiDictProxy(headers))
    headers["Content-Type"] = "application/octet-stream"
    headers[BINARY_HEADER] = str(len(header))
    return Reply(200, b"".join((header, *blobs)), CIMultiDictProxy(headers))


def _check_size(datatype: str, shape: Sequence[int], blob: bytes) -> None:
    dtype = _RAW_DTYPES.get(datatype)
    if dtype is not None and len(blob) != math.prod(shape) * dtype.itemsize:
        raise MalformedAnswer(f"output of {len(blob)} bytes does not fit {datatype} {shape}")


def _json_data(tensor: Any, data: bytes | None, shape: Sequence[int]) -> Any:
    """An output's elements for JSON: numpy for numbers (orjson writes them), str for BYTES."""
    datatype = tensor.datatype
    if data is None:
        field = _CONTENTS.get(datatype)
        values = list(getattr(tensor.contents, field)) if field else []
        if datatype == "BYTES":
            return [v.decode("utf-8", "replace") for v in values]
        return values
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") for v in _bytes_elements(data)]
    _check_size(datatype, shape, data)
    dtype = _RAW_DTYPES.get(datatype)
    if dtype is None:
        raise MalformedAnswer(f"output datatype {datatype!r} is not an OIP datatype")
    return np.frombuffer(data, dtype=dtype)


def _bytes_elements(data: bytes) -> list[bytes]:
    elements: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise MalformedAnswer("BYTES output cut inside an element's length")
        size = int.from_bytes(data[offset:offset + 4], "little")
        offset += 4
        if offset + size > len(data):
            raise MalformedAnswer("BYTES output cut inside an element")
        elements.append(data[offset:offset + size])
        offset += size
    return elements


def _contents_raw(tensor: Any) -> bytes:
    field = _CONTENTS.get(tensor.datatype)
    values = list(getattr(tensor.contents, field)) if field else []
    return raw_tensor(tensor.datatype, values)
