"""The upstream wire format: request bodies, answer checks and failure mapping (pure)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.upstream.transport import (
    ConnectError,
    ConnectFailed,
    ReadTimeout,
    Reset,
    TransportError,
)
from gateway.upstream.wire import (
    Retryable,
    classify_exception,
    error_message,
    exception_error,
    infer_request_body,
    parse_embeddings,
    retry_after,
    server_timing,
    status_outcome,
)


def answer(**overrides: object) -> bytes:
    doc: dict[str, object] = {
        "model_name": "minilm", "model_version": "3",
        "parameters": {"queue_time_ms": 0.25, "compute_time_ms": 2.0, "batch_size": 2},
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                     "data": [1, 2, 3, 4, 5, 6]}],
    }
    doc.update(overrides)
    return orjson.dumps(doc)


def test_request_body_is_one_bytes_tensor() -> None:
    doc = orjson.loads(infer_request_body(["a", "b"]))
    assert doc == {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                               "data": ["a", "b"]}],
                   "parameters": {"binary_data_output": True}}


def binary_answer(vectors: np.ndarray, counts: list[int] | None = None,
                  **overrides: object) -> tuple[bytes, dict[str, str]]:
    """An answer in Triton's binary extension: the JSON, then the outputs' raw bytes."""
    raw = [vectors.astype("<f4").tobytes()]
    outputs: list[object] = [{"name": "embedding", "datatype": "FP32",
                              "shape": list(vectors.shape),
                              "parameters": {"binary_data_size": len(raw[0])}}]
    if counts is not None:
        raw.append(np.asarray(counts, dtype="<i4").tobytes())
        outputs.append({"name": "token_count", "datatype": "INT32", "shape": [len(counts)],
                        "parameters": {"binary_data_size": len(raw[1])}})
    head = answer(outputs=outputs, **overrides)
    return head + b"".join(raw), {"Inference-Header-Content-Length": str(len(head))}


def test_binary_answer_parses_to_the_same_vectors() -> None:
    vectors = np.array([[1.5, -2, 3], [4, 5, 6.25]], dtype=np.float32)
    body, headers = binary_answer(vectors, [4, 7])
    got = parse_embeddings(body, headers, 2, "b1")
    assert got.vectors.dtype == np.float32 and got.vectors.shape == (2, 3)
    np.testing.assert_array_equal(got.vectors, vectors)
    assert got.token_counts == [4, 7]
    assert (got.queue_ms, got.model_version) == (0.25, "3")


@pytest.mark.parametrize(
    ("mangle", "fault"),
    [
        (lambda body, h: (body, {**h, "Inference-Header-Content-Length": "x"}), "bad Inference"),
        (lambda body, h: (body, {**h, "Inference-Header-Content-Length": "99999"}),
         "bad Inference"),
        (lambda body, h: (body[:-4], h), "does not fit"),  # shorter than its sizes say
        (lambda body, h: (body + b"\0" * 4, h), "does not fit"),  # bytes left over
        (lambda body, h: (body[:-8] + np.array([np.inf, 1], "<f4").tobytes(), h),
         "non-finite"),
    ],
)
def test_bad_binary_answers_are_bad_gateway(mangle: object, fault: str) -> None:
    body, headers = binary_answer(np.ones((2, 3), np.float32))
    body, headers = mangle(body, headers)  # type: ignore[operator]
    with pytest.raises(BadGateway, match=fault):
        parse_embeddings(body, headers, 2, "b1")


def test_binary_sizes_must_suit_the_datatype() -> None:
    head = answer(outputs=[{"name": "embedding", "datatype": "FP16", "shape": [2, 3],
                            "parameters": {"binary_data_size": 12}}])
    with pytest.raises(BadGateway, match="does not fit"):
        parse_embeddings(head + bytes(12), {"Inference-Header-Content-Length": str(len(head))},
                         2, "b1")
    head = answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                            "parameters": {"binary_data_size": 23}}])
    with pytest.raises(BadGateway, match="does not fit"):
        parse_embeddings(head + bytes(23), {"Inference-Header-Content-Length": str(len(head))},
                         2, "b1")


def test_good_answer_parses_with_timings_version_and_tokens() -> None:
    got = parse_embeddings(answer(), {}, 2, "b1")
    assert got.vectors.dtype == np.float32
    np.testing.assert_array_equal(got.vectors, [[1, 2, 3], [4, 5, 6]])
    assert (got.queue_ms, got.compute_ms, got.model_version) == (0.25, 2.0, "3")
    assert got.token_counts is None
    tokens = {"name": "token_count", "datatype": "INT64", "shape": [2], "data": [4, 7]}
    body = answer(outputs=[*orjson.loads(answer())["outputs"], tokens], parameters={})
    got = parse_embeddings(body, {"Server-Timing": "queue;dur=1.5, compute;dur=9"}, 2, "b1")
    assert got.token_counts == [4, 7]
    assert (got.queue_ms, got.compute_ms) == (1.5, 9.0)  # from Server-Timing


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        (b"{nope", "invalid JSON"),
        (b"[]", "without outputs"),
        (answer(outputs=[]), "without outputs"),
        (answer(outputs=["x"]), "not FP32"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP16", "shape": [2, 3],
                          "data": [0] * 6}]), "not FP32"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [3, 2],
                          "data": [0] * 6}]), "not FP32"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                          "data": [0] * 5}]), "does not fit"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                          "data": [0, 0, 0, 0, 0, None]}]), "non-finite|does not fit"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                          "data": [0, 0, 0, 0, 0, "x"]}]), "does not fit"),
        (answer(outputs=[{"name": "embedding", "datatype": "FP32", "shape": [2, 3],
                          "data": [0, 0, 0, 0, 0, 1e39]}]), "non-finite"),
    ],
)
def test_bad_answers_are_bad_gateway(body: bytes, fault: str) -> None:
    with pytest.raises(BadGateway, match=fault) as info:
        parse_embeddings(body, {}, 2, "b1")
    assert "b1" in info.value.message


def test_bad_timing_parameters_fall_back() -> None:
    got = parse_embeddings(answer(parameters={"queue_time_ms": "x"}), {}, 2, "b1")
    assert got.queue_ms == 0.0


def test_small_header_and_body_helpers() -> None:
    assert retry_after({"Retry-After": "7"}) == 7.0
    assert retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 1.0
    assert retry_after({}) == 1.0
    assert server_timing({"Server-Timing": "queue;dur=1, compute;desc=x;dur=2, bad;dur=z"}) == {
        "queue": 1.0, "compute": 2.0}
    assert error_message(b'{"error": "shape mismatch"}') == "shape mismatch"
    assert error_message(b"plain text") == "plain text"


def test_status_and_exception_mapping() -> None:
    outcome, error = status_outcome(503, {"Retry-After": "4"}, b"", "b1")
    assert outcome == "overloaded" and isinstance(error, Retryable) and error.reason == "http_503"
    assert isinstance(error.error, Overloaded) and error.error.retry_after_s == 4.0
    outcome, error = status_outcome(504, {}, b"", "b1")
    assert outcome == "gateway_error" and isinstance(error, Retryable)
    assert error.reason == "http_504" and isinstance(error.error, DeadlineExceeded)
    outcome, error = status_outcome(502, {}, b"bad gateway", "b1")
    assert outcome == "gateway_error" and isinstance(error, Retryable)
    assert error.reason == "http_502" and isinstance(error.error, BadGateway)
    assert status_outcome(200, {}, b"", "b1") == ("ok", None)
    assert status_outcome(404, {}, b"", "b1") == ("ok", None)  # the request's fault: no retry
    assert status_outcome(429, {}, b"", "b1") == ("ok", None)
    outcome, error = status_outcome(500, {}, b'{"error": "boom"}', "b1")
    assert outcome == "error" and isinstance(error, Retryable) and error.reason == "http_500"
    assert isinstance(error.error, BadGateway) and "boom" in error.error.message
    outcome, error = status_outcome(302, {}, b"", "b1")  # not an answer, not retried
    assert outcome == "error" and isinstance(error, BadGateway)

    assert classify_exception(TimeoutError(), deadline_passed=True) == "cancelled"
    assert classify_exception(TimeoutError(), deadline_passed=False) == "timeout"
    assert classify_exception(ReadTimeout(), deadline_passed=False) == "timeout"
    assert classify_exception(ConnectError(), deadline_passed=False) == "conn_error"
    assert classify_exception(Reset(), deadline_passed=False) == "conn_error"
    assert classify_exception(ConnectError(), deadline_passed=True) == "cancelled"
    assert classify_exception(TransportError(), deadline_passed=False) == "error"
    reasons = {
        "connect_failure": exception_error("b1", "conn_error", ConnectFailed()),
        "reset": exception_error("b1", "conn_error", Reset()),
        "per_try_timeout": exception_error("b1", "timeout", ReadTimeout()),
    }
    for reason, found in reasons.items():
        assert isinstance(found, Retryable) and found.reason == reason
    assert isinstance(reasons["per_try_timeout"].error, DeadlineExceeded)
    assert isinstance(exception_error("b1", "cancelled", OSError()), DeadlineExceeded)
    assert isinstance(exception_error("b1", "error", OSError()), BadGateway)
