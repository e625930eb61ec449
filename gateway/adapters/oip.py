"""``/v2/models/{name}[/versions/{v}]/infer`` (Open Inference Protocol v2): one item per request.

The canonical form of a request drops ``id`` and orders every object's keys (so ``parameters`` in
any order hash alike); BYTES inputs are normalised and scanned by the policy exactly like the
OpenAI-style routes, and what reaches the backend is the normalised (or redacted) text. The stored
answer never holds the request id; it is put back on the way out.

Answers are JSON: requests for binary outputs (Triton's ``binary_data_output`` and per-output
``binary_data``) are stripped before the key and the backend call, so the gateway caches and
returns JSON, which clients asking for binary data (tritonclient) read too, and such requests
share cache entries with plain ones.

Scheduling parameters (``priority``, ``timeout``, ``fairness_key``) are the gateway's to set
(gateway/upstream/schedule.py): they are left out of the key and of what is sent as is; a
client's ``priority`` may only lower its request's backend priority and its ``timeout``
(microseconds) only shorten its deadline.

Client data is never walked recursively: a tensor's ``data`` may nest at most as deep as its
shape has dimensions (flat data is always accepted), checked with an explicit stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.adapters.fields import whole
from gateway.errors import ValidationFailed
from gateway.pipeline import PerRequest, Result
from gateway.upstream.schedule import SCHEDULE_PARAMETERS, client_schedule

MAX_TENSOR_ELEMENTS = 4096
"""A hard cap against huge flattened tensors; the policy's ``max_items`` is the real limit."""
MAX_SHAPE_DIMS = 8
_TENSOR_KEYS = {"name", "datatype", "shape", "data", "parameters"}


@dataclass(frozen=True, slots=True, kw_only=True)
class OipCall:
    """A validated OIP infer request: its BYTES texts pulled out (row-major order) for the
    policy, the rest as the backend will get it (``unit``: one item per request)."""

    model: str
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    unit: PerRequest
    request_id: str | None
    """The client's ``id``: never stored, put back on the way out."""

    def render(self, result: Result) -> bytes:
        body = result.outcomes[0].value
        if self.request_id is None:
            return body
        answer = orjson.loads(body)
        answer["id"] = self.request_id
        return orjson.dumps(answer)


def _without_parameter(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj`` without ``parameters[name]`` (and without ``parameters`` if that empties it)."""
    params = obj.get("parameters")
    if not isinstance(params, dict) or name not in params:
        return obj
    rest = {k: v for k, v in params.items() if k != name}
    trimmed = {k: v for k, v in obj.items() if k != "parameters"}
    if rest:
        trimmed["parameters"] = rest
    return trimmed


def flatten(data: Any, max_depth: int, where: str) -> list[Any]:
    """Row-major elements of (possibly nested) tensor data, iteratively, nesting bounded."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack: list[tuple[list[Any], int, int]] = [(data, 0, 1)]  # list, next index, depth
    while stack:
        items, i, depth = stack.pop()
        while i < len(items):
            item = items[i]
            i += 1
            if isinstance(item, list):
                if depth >= max_depth:
                    raise ValidationFailed(where, f"nests deeper than its shape's {max_depth} "
                                                  "dimensions")
                stack.append((items, i, depth))
                items, i, depth = item, 0, depth + 1
            else:
                out.append(item)
                if len(out) > MAX_TENSOR_ELEMENTS:
                    raise ValidationFailed(where, f"more than {MAX_TENSOR_ELEMENTS} elements")
    return out


def parse_oip(data: dict[str, Any], model: str) -> OipCall:
    """Check the request against the OIP v2 schema for a text (BYTES) model."""
    unknown = set(data) - {"id", "inputs", "outputs", "parameters"}
    if unknown:
        raise ValidationFailed(sorted(unknown)[0], "unknown field in an OIP infer request")
    if "id" in data and not isinstance(data["id"], str):
        raise ValidationFailed("id", "must be a string")
    if "parameters" in data and not isinstance(data["parameters"], dict):
        raise ValidationFailed("parameters", "must be an object")
    for name in ("priority", "timeout"):
        value = (data.get("parameters") or {}).get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= 1 << 40):
            raise ValidationFailed(f"parameters.{name}", "must be a non-negative integer")
    outputs = data.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)):
        raise ValidationFailed("outputs", "must be a list of objects with a string name")
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValidationFailed("inputs", "must be a non-empty list of tensors")
    texts: list[str] = []
    for i, tensor in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise ValidationFailed(where, "must be an object")
        extra = set(tensor) - _TENSOR_KEYS
        if extra:
            raise ValidationFailed(f"{where}.{sorted(extra)[0]}", "unknown tensor field")
        if not isinstance(tensor.get("name"), str) or not tensor["name"]:
            raise ValidationFailed(f"{where}.name", "is required (a string)")
        if tensor.get("datatype") != "BYTES":
            raise ValidationFailed(f"{where}.datatype",
                                   "must be BYTES: the gateway serves text models")
        shape = tensor.get("shape")
        dims = [whole(d) for d in shape] if isinstance(shape, list) else []
        if (not 0 < len(dims) <= MAX_SHAPE_DIMS
                or not all(d is not None and d >= 0 for d in dims)):
            raise ValidationFailed(f"{where}.shape", f"must be a list of 1 to {MAX_SHAPE_DIMS} "
                                                     "non-negative integers")
        # [2.0] is the integer 2 in JSON Schema; the backend gets plain integers.
        shape = tensor["shape"] = [int(d) for d in dims if d is not None]
        if "data" not in tensor:
            raise ValidationFailed(f"{where}.data", "is required")
        if "parameters" in tensor and not isinstance(tensor["parameters"], dict):
            raise ValidationFailed(f"{where}.parameters", "must be an object")
        flat = flatten(tensor["data"], len(shape), f"{where}.data")
        size = math.prod(shape)
        if len(flat) != size:
            raise ValidationFailed(f"{where}.data", f"has {len(flat)} elements but shape {shape} "
                                                    f"needs {size}")
        for j, item in enumerate(flat):
            if not isinstance(item, str):
                raise ValidationFailed(f"{where}.data[{j}]", "BYTES elements must be strings")
        texts.extend(flat)
        if len(texts) > MAX_TENSOR_ELEMENTS:
            raise ValidationFailed(where, f"more than {MAX_TENSOR_ELEMENTS} elements in one "
                                          "request")
    own_priority, own_timeout_s = client_schedule(data.get("parameters"))
    return OipCall(model=model, groups=(("inputs", tuple(texts)),), request_id=data.get("id"),
                   unit=PerRequest(template=_template(data),
                                   sizes=tuple(math.prod(t["shape"]) for t in inputs),
                                   client_priority=own_priority,
                                   client_timeout_s=own_timeout_s))


def _template(data: dict[str, Any]) -> dict[str, Any]:
    """The request as the backend gets it, less its inputs' data: no id, JSON answers, none of
    the scheduling parameters (the gateway's to set, per call: schedule.py)."""
    out = {k: v for k, v in data.items() if k != "id"}
    out["inputs"] = [{k: v for k, v in t.items() if k != "data"} for t in data["inputs"]]
    out = _without_parameter(out, "binary_data_output")  # the gateway answers JSON
    for name in SCHEDULE_PARAMETERS:
        out = _without_parameter(out, name)
    if isinstance(out.get("outputs"), list):
        out["outputs"] = [_without_parameter(o, "binary_data") for o in out["outputs"]]
    return out
