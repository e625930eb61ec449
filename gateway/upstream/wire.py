"""The OIP v2 wire format as the upstream client speaks it: request bodies and answer checks.

Pure functions over bytes, headers and exceptions (no I/O): what goes out to a backend, whether
what came back is an answer the gateway may use, and how each failure counts for the router and
which gateway error it becomes. A malformed answer raises ``BadGateway`` naming the backend and
the fault, never the request's text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.errors import BadGateway, DeadlineExceeded, GatewayError, Overloaded
from gateway.routing.outlier import BackendResult
from gateway.upstream.transport import ConnectError, ReadTimeout, Reset


class Retryable(Exception):
    """An attempt failed in a way another backend may not; whether it is retried is the retry
    policy's call (gateway/upstream/retry.py).

    ``reason`` names the failure as the retry metrics do: ``connect_failure``, ``reset``,
    ``per_try_timeout`` or ``http_<status>`` (a 5xx answer); ``error`` is what the client gets
    when it is not retried.
    """

    def __init__(self, reason: str, error: GatewayError) -> None:
        super().__init__(error.message)
        self.reason = reason
        self.error = error


@dataclass(frozen=True, slots=True)
class Embeddings:
    """A checked OIP embedding answer."""

    vectors: np.ndarray  # float32 [n, dim]
    queue_ms: float
    compute_ms: float
    model_version: str | None
    token_counts: list[int] | None


BINARY_HEADER = "Inference-Header-Content-Length"
_BINARY_DTYPES = {"FP32": np.dtype("<f4"), "INT32": np.dtype("<i4")}


def infer_request_body(texts: Sequence[str], parameters: Mapping[str, Any] | None = None
                       ) -> bytes:
    """An OIP infer request with the texts as one BYTES tensor ``text`` of shape [n], and
    ``parameters`` (the scheduling ones: schedule.py) besides ``binary_data_output``.

    It asks for every output as binary data (Triton's ``binary_data_output``): raw float32 is
    read with one copy where 384 floats in JSON took longer to parse than the rest of a miss.
    A server that ignores the parameter answers JSON, which ``parse_embeddings`` reads too.
    """
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return orjson.dumps({"inputs": [tensor],
                         "parameters": {"binary_data_output": True, **(parameters or {})}})


_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")
"""An ASCII decimal number, the only shape of a number read from the backend's headers."""


def retry_after(headers: Mapping[str, str]) -> float:
    """The backend's ``Retry-After`` in seconds (1 when absent or an HTTP date)."""
    value = headers.get("Retry-After", "1")
    if not _DECIMAL.fullmatch(value):  # float() would also take "٣", "1_0" and "inf"
        return 1.0
    return min(float(value), 3600.0)


def server_timing(headers: Mapping[str, str]) -> dict[str, float]:
    """``queue;dur=1.2, compute;dur=3.4`` -> {"queue": 1.2, "compute": 3.4} (milliseconds)."""
    found: dict[str, float] = {}
    for metric in headers.get("Server-Timing", "").split(","):
        name, _, rest = metric.strip().partition(";")
        for param in rest.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and _DECIMAL.fullmatch(value):
                found[name.strip()] = float(value)
    return found


def error_message(body: bytes) -> str:
    """The message of an OIP error body ``{"error": "..."}``, cut to 200 characters."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error)[:200] if error is not None else ""


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _attach_binary(outputs: list[Any], binary: bytes, backend: str) -> None:
    """Puts each binary output's slice of ``binary`` under its ``data`` (numpy, read-only),
    in order; the sizes must add up to the binary part exactly."""
    offset = 0
    for out in outputs:
        params = out.get("parameters") if isinstance(out, dict) else None
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is None:
            continue
        dtype = _BINARY_DTYPES.get(out.get("datatype"))
        if (dtype is None or not isinstance(size, int) or isinstance(size, bool) or size < 0
                or offset + size > len(binary) or size % dtype.itemsize):
            raise BadGateway(f"backend {backend} answered binary data that does not fit")
        data = np.frombuffer(binary, dtype=dtype, count=size // dtype.itemsize, offset=offset)
        out["data"] = data if dtype.kind == "f" else data.tolist()
        offset += size
    if offset != len(binary):
        raise BadGateway(f"backend {backend} answered binary data that does not fit")


def _token_counts(doc: dict[str, Any], outputs: list[Any], n: int) -> list[int] | None:
    """Tokens per text, from an INT output ``token_count`` [n] or ``parameters.token_counts``."""
    found: Any = None
    for out in outputs:
        if isinstance(out, dict) and out.get("name") in ("token_count", "token_counts"):
            found = out.get("data")
    params = doc.get("parameters")
    if found is None and isinstance(params, dict):
        found = params.get("token_counts")
    if (isinstance(found, list) and len(found) == n
            and all(isinstance(c, int) and not isinstance(c, bool) for c in found)):
        return found
    return None


def parse_embeddings(
    body: bytes, headers: Mapping[str, str], n: int, backend: str
) -> Embeddings:
    """Check an infer answer for ``n`` texts: an FP32 output ``embedding`` of shape [n, dim],
    in JSON or as binary data after the JSON part (``Inference-Header-Content-Length``)."""
    binary = b""
    length = headers.get(BINARY_HEADER)
    if length is not None:
        if not (length.isascii() and length.isdigit()) or int(length) > len(body):
            raise BadGateway(f"backend {backend} answered a bad {BINARY_HEADER}")
        body, binary = body[:int(length)], body[int(length):]
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadGateway(f"backend {backend} answered with invalid JSON") from None
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, list) or not outputs:
        raise BadGateway(f"backend {backend} answered without outputs")
    if length is not None:
        _attach_binary(outputs, binary, backend)
    named = [o for o in outputs if isinstance(o, dict) and o.get("name") == "embedding"]
    out = named[0] if named else outputs[0]
    shape = out.get("shape") if isinstance(out, dict) else None
    if (not isinstance(out, dict) or out.get("datatype") != "FP32"
            or not isinstance(shape, list) or len(shape) != 2 or shape[0] != n
            or not isinstance(shape[1], int) or shape[1] < 1):
        raise BadGateway(f"backend {backend} answered an output that is not FP32 [{n}, dim]")
    data = out.get("data")
    try:
        if isinstance(data, np.ndarray):  # from the binary part: already float32
            vectors = data.reshape(n, shape[1])
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # caught below as non-finite
                vectors = np.asarray(data, dtype=np.float32).reshape(n, shape[1])
    except (TypeError, ValueError):
        raise BadGateway(f"backend {backend} answered data that does not fit its shape") from None
    if not np.isfinite(vectors).all():
        raise BadGateway(f"backend {backend} answered non-finite numbers")
    params = doc.get("parameters")
    params = params if isinstance(params, dict) else {}
    queue_ms = _number(params.get("queue_time_ms"))
    compute_ms = _number(params.get("compute_time_ms"))
    if queue_ms is None or compute_ms is None:
        # Server-Timing is parsed only when the body lacks the figures: a miss does not wait
        # for a string scan our backend's answers never need.
        timing = server_timing(headers)
        queue_ms = timing.get("queue", 0.0) if queue_ms is None else queue_ms
        compute_ms = timing.get("compute", 0.0) if compute_ms is None else compute_ms
    version = doc.get("model_version")
    return Embeddings(
        vectors=vectors,
        queue_ms=queue_ms,
        compute_ms=compute_ms,
        model_version=version if isinstance(version, str) else None,
        token_counts=_token_counts(doc, outputs, n),
    )


def classify_exception(exc: BaseException, *, deadline_passed: bool) -> BackendResult:
    """How a transport failure counts for the router."""
    if deadline_passed:
        return "cancelled"  # the client's deadline, not the backend's fault
    if isinstance(exc, ReadTimeout | TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectError):
        return "conn_error"
    return "error"


def exception_error(backend: str, outcome: BackendResult, exc: BaseException) -> Exception:
    """The gateway error for a transport failure (``Retryable`` when another backend may do)."""
    if outcome == "cancelled":
        return DeadlineExceeded("deadline passed while waiting for the backend")
    if outcome == "timeout":
        return Retryable("per_try_timeout", DeadlineExceeded(
            f"backend {backend} did not answer within the per-try timeout"))
    if outcome == "conn_error":
        if isinstance(exc, Reset):
            return Retryable("reset", BadGateway(
                f"backend {backend} dropped the connection: {type(exc).__name__}"))
        return Retryable("connect_failure", BadGateway(
            f"could not reach backend {backend}: {type(exc).__name__}"))
    return BadGateway(f"backend {backend} failed: {type(exc).__name__}")


def status_outcome(
    status: int, headers: Mapping[str, str], body: bytes, backend: str
) -> tuple[BackendResult, Exception | None]:
    """How a complete HTTP answer counts for the router, and the error unless it is usable.

    2xx and 4xx count as "ok": the backend is alive and answering (a 4xx is the request's
    fault, never retried). A 5xx is ``Retryable`` (the retry policy decides): 503 is the
    backend shedding load ("overloaded", 503 with its ``Retry-After`` to the client), 502 and
    504 are gateway failures, as a proxy in front of a dead or frozen model server answers.
    """
    if 200 <= status < 300 or 400 <= status < 500:
        return "ok", None
    reason = f"http_{status}"
    if status == 503:
        return "overloaded", Retryable(reason, Overloaded(
            f"backend {backend} is overloaded", reason="backend_overloaded",
            retry_after_s=retry_after(headers),
        ))
    if status == 504:
        return "gateway_error", Retryable(reason, DeadlineExceeded(
            f"backend {backend} answered 504: {error_message(body)}"))
    error = BadGateway(f"backend {backend} answered {status}: {error_message(body)}")
    if status == 502:
        return "gateway_error", Retryable(reason, error)
    if 500 <= status < 600:
        return "error", Retryable(reason, error)
    return "error", error
