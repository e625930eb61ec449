"""OIP v2 REST exchanges as ``inference.GRPCInferenceService`` calls, and back (pure: no grpc,
no I/O): the translation the gRPC transport (grpc.py) does, so that the upstream client, the
health checker and ``wire.parse_embeddings`` speak REST to every backend. The infer answer's
rendering (``infer_reply``) is in grpc_answer.py.

    REST request (what the client builds)         gRPC call
    GET  /v2/health/ready                         ServerReady    -> 200 / 503 {"ready": ...}
    GET  /v2/models/{m}[/versions/{v}]            ModelMetadata  -> 200, the metadata JSON
    POST /v2/models/{m}[/versions/{v}]/infer      ModelInfer     -> the REST answer

An infer body's tensors go out in ``raw_input_contents`` (BYTES as 4-byte little-endian length
plus bytes, per element), as tritonclient sends them. The answer is rendered as a REST backend
renders it: with ``binary_data_output`` (request) or ``binary_data`` (output) asked for, in
Triton's binary layout (the JSON part, then each binary output's raw bytes;
``Inference-Header-Content-Length``), which ``parse_embeddings`` reads with one copy; otherwise
JSON with ``data`` (the OIP passthrough route). The raw output bytes of the binary layout are
the message's ``raw_output_contents`` as they are: nothing is decoded on the way.

Status codes become the HTTP statuses a REST backend answers, so ``wire.status_outcome`` counts
and maps both protocols alike (``status_reply``). A call that never reached the backend's
service (UNAVAILABLE raised by the channel, not the server) is a ``ConnectFailed`` or a
``Reset``, as aiohttp's connection errors are.

The trailing metadata becomes headers: ``server-timing`` -> ``Server-Timing`` (queue and compute
for ``wire.server_timing``), ``x-request-id``, ``retry-after``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.upstream.transport import ConnectFailed, Reply, Reset
from oip import inference_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"
BINARY_HEADER = "Inference-Header-Content-Length"
_RAW_DTYPES = {
    "BOOL": np.dtype("?"), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_TRAILERS = {"server-timing": "Server-Timing", "x-request-id": "X-Request-Id",
             "retry-after": "Retry-After"}


@dataclass(frozen=True, slots=True)
class Render:
    """How to render a ``ModelInferResponse``: which outputs as binary data."""

    all_binary: bool = False
    binary: frozenset[str] = frozenset()
    json: frozenset[str] = frozenset()  # asked for as JSON although all_binary

    def is_binary(self, name: str) -> bool:
        return name in self.binary or (self.all_binary and name not in self.json)


@dataclass(frozen=True, slots=True)
class RpcCall:
    """A REST request as a gRPC call: the method's path on the wire and its message."""

    method: str
    message: Any  # one of the request messages of oip_pb2
    render: Render = Render()


def to_call(method: str, path: str, body: bytes | None) -> RpcCall | Reply:
    """The call for a REST request, or the REST answer when there is no such call (404/405,
    or 400 for an infer body that is not an OIP request)."""
    parts = [unquote(p) for p in path.split("?", 1)[0].split("/")]
    if parts[:2] != ["", "v2"]:
        return _error(404, f"{path} has no gRPC equivalent")
    rest = parts[2:]
    if rest == ["health", "ready"]:
        return RpcCall("ServerReady", pb.ServerReadyRequest()) if method == "GET" else _405()
    if len(rest) < 2 or rest[0] != "models" or not rest[1]:
        return _error(404, f"{path} has no gRPC equivalent")
    model, tail = rest[1], rest[2:]
    version = ""
    if len(tail) >= 2 and tail[0] == "versions":
        version, tail = tail[1], tail[2:]
    if not tail:
        if method != "GET":
            return _405()
        return RpcCall("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version))
    if tail != ["infer"]:
        return _error(404, f"{path} has no gRPC equivalent")
    if method != "POST":
        return _405()
    try:
        message, render = infer_request(model, version, body or b"")
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError,
            OverflowError) as exc:
        return _error(400, f"not an OIP infer request the gateway can send over gRPC: {exc}")
    return RpcCall("ModelInfer", message, render)


def infer_request(model: str, version: str, body: bytes
                  ) -> tuple[pb.ModelInferRequest, Render]:
    """An OIP REST infer body as a ``ModelInferRequest`` with ``raw_input_contents``."""
    doc = orjson.loads(body)
    message = pb.ModelInferRequest(model_name=model, model_version=version,
                                   id=str(doc.get("id") or ""))
    params = dict(doc.get("parameters") or {})
    all_binary = params.pop("binary_data_output", False) is True
    _set_parameters(message.parameters, params)
    for tensor in doc["inputs"]:
        add = message.inputs.add(name=tensor["name"], datatype=tensor["datatype"],
                                 shape=tensor["shape"])
        extra = dict(tensor.get("parameters") or {})
        extra.pop("binary_data_size", None)  # REST's own binary extension
        _set_parameters(add.parameters, extra)
        message.raw_input_contents.append(raw_tensor(tensor["datatype"], tensor["data"]))
    binary: set[str] = set()
    json: set[str] = set()
    for output in doc.get("outputs") or ():
        extra = dict(output.get("parameters") or {})
        wants = extra.pop("binary_data", None)
        name = output["name"]
        if wants is True:
            binary.add(name)
        elif wants is False:
            json.add(name)
        _set_parameters(message.outputs.add(name=name).parameters, extra)
    return message, Render(all_binary, frozenset(binary), frozenset(json))


def raw_tensor(datatype: str, data: Sequence[Any]) -> bytes:
    """A tensor's flat ``data`` in the raw layout (BYTES: length-prefixed elements)."""
    if datatype == "BYTES":
        parts: list[bytes] = []
        for element in data:
            raw = element.encode() if isinstance(element, str) else bytes(element)
            parts += (len(raw).to_bytes(4, "little"), raw)
        return b"".join(parts)
    dtype = _RAW_DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"datatype {datatype!r} is not an OIP datatype")
    return np.asarray(data, dtype=dtype).tobytes()


def _set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value >= 2**63:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise TypeError(f"parameter {key!r} must be a bool, number or string")


def ready_reply(response: pb.ServerReadyResponse, trailing: Iterable[tuple[str, Any]]
                ) -> Reply:
    """ServerReady as ``/v2/health/ready`` answers: 200 when ready, else 503."""
    return _json(200 if response.ready else 503, {"ready": response.ready}, trailing)


def metadata_reply(response: pb.ModelMetadataResponse, trailing: Iterable[tuple[str, Any]]
                   ) -> Reply:
    """ModelMetadata as ``/v2/models/{m}`` answers it."""
    def tensors(items: Iterable[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return _json(200, {"name": response.name, "versions": list(response.versions),
                       "platform": response.platform, "inputs": tensors(response.inputs),
                       "outputs": tensors(response.outputs)}, trailing)


def status_reply(code: str, details: str, trailing: Iterable[tuple[str, Any]]) -> Reply:
    """A gRPC status other than OK as the REST answer it stands for, or raises the transport
    error when the call never reached the service.

        UNAVAILABLE from the channel       ConnectFailed (could not connect) or Reset
        UNAVAILABLE from the server        503 + Retry-After (not ready, shutting down)
        RESOURCE_EXHAUSTED                 503 + Retry-After (queue full; 1 s when absent);
                                           413 when a message is past a size limit
        DEADLINE_EXCEEDED                  504
        INVALID_ARGUMENT, NOT_FOUND        400, 404 (the request's fault: passed through)
        UNIMPLEMENTED                      501
        anything else                      500
    """
    headers = trailers(trailing)
    if code == "UNAVAILABLE" and "X-Request-Id" not in headers:
        # The backend's own aborts always carry x-request-id; without it the channel failed.
        lowered = details.lower()
        if "failed to connect" in lowered or "connection refused" in lowered \
                or "dns" in lowered or "resolve" in lowered:
            raise ConnectFailed(f"gRPC UNAVAILABLE: {details[:120]}")
        raise Reset(f"gRPC UNAVAILABLE: {details[:120]}")
    if code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"):
        if code == "RESOURCE_EXHAUSTED" and "larger than max" in details:
            status = 413
        else:
            status = 503
            headers.setdefault("Retry-After", "1")
    else:
        status = {"DEADLINE_EXCEEDED": 504, "INVALID_ARGUMENT": 400, "NOT_FOUND": 404,
                  "UNIMPLEMENTED": 501}.get(code, 500)
    headers["Content-Type"] = "application/json"
    body = orjson.dumps({"error": details or code})
    return Reply(status, body, CIMultiDictProxy(headers))


def trailers(trailing: Iterable[tuple[str, Any]]) -> CIMultiDict[str]:
    """The trailing metadata REST carries in headers, under REST's header names."""
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in trailing or ():
        name = _TRAILERS.get(key)
        if name is not None and isinstance(value, str):
            headers[name] = value
    return headers


def _json(status: int, doc: Any, trailing: Iterable[tuple[str, Any]]) -> Reply:
    headers = trailers(trailing)
    headers["Content-Type"] = "application/json"
    return Reply(status, orjson.dumps(doc), CIMultiDictProxy(headers))


def _error(status: int, message: str) -> Reply:
    return _json(status, {"error": message}, ())


def _405() -> Reply:
    return _error(405, "method not allowed")
