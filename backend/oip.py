"""Open Inference Protocol v2 (REST) bodies: inference requests parsed, responses encoded.

Follows kserve/open-inference-protocol ``specification/protocol/inference_rest.md``: tensor data
in row-major order, either flat or in its natural nested form; ``id`` echoed; ``outputs``
selects what comes back; errors are ``{"error": "<message>"}`` (rendered by the middleware).
Triton's binary tensor extension is accepted for inputs (``Inference-Header-Content-Length``),
so tritonclient works with its defaults, and used for outputs on request: an output asked for
with ``"parameters": {"binary_data": true}`` (or every output, with the request parameter
``binary_data_output: true``) comes back as raw little-endian bytes after the JSON part, its size
in the output's ``parameters.binary_data_size``. The gateway asks for the embeddings that way:
reading 384 floats from JSON cost it more than the rest of a cache miss.

Pure functions: no aiohttp, no I/O. Every rule broken raises ``BadRequest``. The responses are
encoded in oip_response.py.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.envelope import decode_json, whole
from backend.errors import BadRequest
from backend.repository import TensorSpec
from backend.scheduling.params import NONE, ScheduleParams, parse_schedule


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A validated inference request: the texts, in order, and what to send back."""

    id: str | None
    texts: list[str]
    outputs: tuple[str, ...] | None  # None: every output
    binary: frozenset[str] = frozenset()  # outputs to send as binary data
    binary_all: bool = False  # the request parameter binary_data_output: every output binary
    schedule: ScheduleParams = NONE  # priority, timeout, fairness key

    def wants_binary(self, name: str) -> bool:
        """Whether output ``name`` goes out as binary data."""
        return self.binary_all or name in self.binary


# A derived output every text model has: the tokens each text used (after truncation), so that
# a caller caching per text (the gateway) can report usage without tokenizing again.
TOKEN_COUNT = "token_count"
TOKEN_COUNT_SPEC = {"name": TOKEN_COUNT, "datatype": "INT32", "shape": [-1]}
_LENGTH = struct.Struct("<I")


def parse_infer_request(
    body: bytes,
    *,
    input_spec: TensorSpec,
    output_names: Sequence[str],
    max_items: int,
    json_length: int | None = None,
) -> InferRequest:
    """Parses and validates an inference request for a one-BYTES-input text model.

    ``json_length`` is the ``Inference-Header-Content-Length`` header: the JSON part's size
    when binary tensor data follows it. The body is read through a memoryview: neither part is
    copied, and each text is decoded straight from the body's bytes.
    """
    view = memoryview(body)
    binary = view[:0]
    if json_length is not None:
        if not 0 <= json_length <= len(view):
            raise BadRequest("Inference-Header-Content-Length is larger than the body")
        view, binary = view[:json_length], view[json_length:]
    raw = decode_json(view)
    if not isinstance(raw, dict):
        raise BadRequest("the request body must be a JSON object")
    request_id = raw.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    binary_all = parameters.get("binary_data_output", False)
    if not isinstance(binary_all, bool):
        raise BadRequest("parameter 'binary_data_output' must be true or false")
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("'inputs' must be a non-empty list of input tensors")
    chunks = binary_chunks(inputs, binary)
    if len(inputs) != 1:
        raise BadRequest(f"the model takes one input ({input_spec.name!r}), got {len(inputs)}")
    texts = _parse_input(inputs[0], input_spec, chunks[0])
    if not texts:
        raise BadRequest(f"input {input_spec.name!r} holds no texts")
    if len(texts) > max_items:
        raise BadRequest(f"too many items: {len(texts)} texts; at most {max_items} per request")
    names = [*output_names, TOKEN_COUNT]
    outputs, binary_outputs = _parse_outputs(raw.get("outputs"), names)
    return InferRequest(request_id, texts, outputs, binary_outputs, binary_all,
                        parse_schedule(parameters))


def binary_chunks(inputs: list[Any], binary: memoryview) -> list[memoryview | None]:
    """Each input's slice of the binary part (None for an input whose data is in the JSON).

    Triton's binary tensor extension: an input with ``parameters.binary_data_size`` takes the
    next that many bytes after the JSON, in input order, so JSON and binary inputs may mix. The
    sizes must add up to exactly the binary part: bytes left over mean the request is not what
    its sender thinks it is.
    """
    chunks: list[memoryview | None] = []
    offset = 0
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise BadRequest("every input tensor must be an object")
        parameters = tensor.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadRequest(f"input {index}: 'parameters' must be an object")
        if "binary_data_size" not in parameters:
            chunks.append(None)
            continue
        size = whole(parameters["binary_data_size"])
        if size is None or size < 0:
            raise BadRequest(f"input {index}: binary_data_size must be a non-negative integer")
        if "data" in tensor:
            raise BadRequest(f"input {index}: has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise BadRequest(
                f"input {index}: binary_data_size {size} runs past the binary data "
                f"({len(binary) - offset} bytes left; Inference-Header-Content-Length gives "
                "the size of the JSON part)"
            )
        chunks.append(binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise BadRequest(f"the inputs' binary_data_size add up to {offset} bytes, but "
                         f"{len(binary)} bytes of binary data follow the JSON")
    return chunks


def check_tensor(name: Any, datatype: Any, shape: Any, spec: TensorSpec) -> int:
    """Validates an input tensor's name, datatype and shape against the model's text input;
    returns its element count. Shared by REST and gRPC."""
    if name != spec.name:
        raise BadRequest(f"unknown input {name!r}: the model's input is {spec.name!r}")
    if datatype != spec.datatype:
        raise BadRequest(f"input {spec.name!r} has datatype {datatype!r}; expected {spec.datatype}")
    dims = [whole(d) for d in shape] if isinstance(shape, list) else [None]
    if not all(d is not None and d >= 0 for d in dims):
        raise BadRequest(f"input {spec.name!r}: 'shape' must be a list of non-negative integers")
    shape = [d for d in dims if d is not None]
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise BadRequest(f"input {spec.name!r}: shape {shape} is not supported; use [n] or [n, 1]")
    return math.prod(shape)


def _parse_input(tensor: dict[str, Any], spec: TensorSpec, chunk: memoryview | None
                 ) -> list[str]:
    shape = tensor.get("shape")
    count = check_tensor(tensor.get("name"), tensor.get("datatype"), shape, spec)
    if chunk is not None:
        return decode_bytes_elements(chunk, count, spec.name)
    if "data" not in tensor:
        raise BadRequest(f"input {spec.name!r} has no 'data'")
    flat = _flatten(tensor["data"], tensor["shape"], spec.name)  # a list: checked
    if len(flat) != count:
        raise BadRequest(
            f"input {spec.name!r}: shape {shape} needs {count} elements, data holds {len(flat)}"
        )
    for index, value in enumerate(flat):
        if not isinstance(value, str):
            raise BadRequest(
                f"input {spec.name!r}: element {index} is {type(value).__name__}; "
                "BYTES data must be strings"
            )
    return flat


def _flatten(data: Any, shape: list[int], name: str) -> list[Any]:
    """Row-major elements of ``data``, given flat or nested exactly as ``shape`` says."""
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: 'data' must be a list")
    if len(shape) == 2 and data and all(isinstance(row, list) for row in data):
        if not all(len(row) == shape[1] for row in data):
            raise BadRequest(f"input {name!r}: nested data does not match shape {shape}")
        return [value for row in data for value in row]
    return data


def decode_bytes_elements(raw: memoryview, count: int, name: str) -> list[str]:
    """Texts from the raw BYTES layout (REST binary extension and gRPC raw contents alike):
    per element a 4-byte little-endian length, then that many UTF-8 bytes."""
    texts: list[str] = []
    size = len(raw)
    offset = 0
    while offset < size:
        if offset + 4 > size:
            raise BadRequest(f"input {name!r}: truncated binary BYTES element")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise BadRequest(f"input {name!r}: truncated binary BYTES element")
        try:
            texts.append(str(raw[offset : offset + length], "utf-8"))
        except UnicodeDecodeError:
            raise BadRequest(f"input {name!r}: element {len(texts)} is not valid UTF-8") from None
        offset += length
    if len(texts) != count:
        raise BadRequest(f"input {name!r}: shape needs {count} elements, binary data holds "
                         f"{len(texts)}")
    return texts


def _parse_outputs(
    raw: Any, output_names: Sequence[str]
) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    """The outputs asked for (None: all) and those asked for as binary data."""
    if raw is None:
        return None, frozenset()
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    names: list[str] = []
    binary: set[str] = set()
    for entry in raw:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name not in output_names:
            raise BadRequest(f"unknown output {name!r}: the model's outputs are "
                             f"{', '.join(output_names)}")
        parameters = entry.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequest(f"output {name!r}: 'parameters' must be an object")
        wanted = parameters.get("binary_data", False)
        if not isinstance(wanted, bool):
            raise BadRequest(f"output {name!r}: parameter 'binary_data' must be true or false")
        if wanted:
            binary.add(name)
        names.append(name)
    return tuple(names), frozenset(binary)
