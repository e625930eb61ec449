"""OIP v2 request parsing and response encoding, and the shared request envelope (pure)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from backend import oip, oip_response
from backend.envelope import check_content_type, request_id, server_timing, timeout_from_header
from backend.errors import BadRequest, UnsupportedMediaType
from backend.repository import ModelConfig, TensorSpec

TEXT = TensorSpec("text", "BYTES", (-1,))
CONFIG = ModelConfig(
    name="minilm", version="1", platform="onnxruntime_onnx", directory=Path("/nowhere"),
    dim=4, max_seq_length=256, max_batch_size=32, max_queue_delay_ms=2.0, max_queue_size=64,
    tokenizer_path=Path("/nowhere/tokenizer.json"), variants={}, default_variant="fp32",
    onnx_inputs=("input_ids", "attention_mask"), onnx_output="sentence_embedding",
    inputs=(TEXT,), outputs=(TensorSpec("embedding", "FP32", (-1, 4)),),
)


def parse(body: Any, *, max_items: int = 8, json_length: int | None = None) -> oip.InferRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return oip.parse_infer_request(
        raw, input_spec=TEXT, output_names=["embedding"], max_items=max_items,
        json_length=json_length,
    )


def text_input(data: Any, shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "text", "datatype": "BYTES",
              "shape": shape if shape is not None else [len(data)], "data": data}
    tensor.update(extra)
    return {"inputs": [tensor]}


def test_flat_request_with_id_and_outputs() -> None:
    body = text_input(["a", "b"]) | {"id": "42", "outputs": [{"name": "embedding"}]}
    request = parse(body)
    assert request == oip.InferRequest("42", ["a", "b"], ("embedding",))


def test_nested_row_major_data_for_an_n_by_1_shape() -> None:
    assert parse(text_input([["a"], ["b"], ["c"]], shape=[3, 1])).texts == ["a", "b", "c"]
    assert parse(text_input(["a", "b"], shape=[2, 1])).texts == ["a", "b"]


def test_triton_binary_bytes_extension() -> None:
    texts = ["héllo", "", "wörld"]
    binary = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    header = orjson.dumps({"inputs": [{
        "name": "text", "datatype": "BYTES", "shape": [3],
        "parameters": {"binary_data_size": len(binary)},
    }]})
    assert parse(header + binary, json_length=len(header)).texts == texts
    bad = struct.pack("<I", 2) + b"\xff\xfe"
    header = orjson.dumps({"inputs": [{
        "name": "text", "datatype": "BYTES", "shape": [1],
        "parameters": {"binary_data_size": len(bad)},
    }]})
    with pytest.raises(BadRequest, match="UTF-8"):
        parse(header + bad, json_length=len(header))


def packed(*texts: str) -> bytes:
    """Triton's raw BYTES layout: per element a 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


def binary_request(inputs: list[dict[str, Any]], binary: bytes) -> tuple[bytes, int]:
    header = orjson.dumps({"inputs": inputs})
    return header + binary, len(header)


def binary_text(count: int, size: int) -> dict[str, Any]:
    return {"name": "text", "datatype": "BYTES", "shape": [count],
            "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize(
    ("inputs", "binary", "message"),
    [
        ([binary_text(1, 9)], packed("abc"), "runs past the binary data"),
        ([binary_text(1, 7)], packed("abc") + b"extra", "add up to 7 bytes, but 12 bytes"),
        ([binary_text(1, 7)], struct.pack("<I", 10) + b"abc", "truncated binary BYTES element"),
        ([binary_text(1, 2)], b"ab", "truncated binary BYTES element"),
        ([binary_text(2, 7)], packed("abc"), "shape needs 2 elements, binary data holds 1"),
        ([binary_text(1, -1)], b"", "non-negative integer"),
        ([binary_text(1, True)], packed("a"), "non-negative integer"),
        ([{**binary_text(1, 5), "data": ["a"]}], packed("a"), "both 'data' and"),
        ([{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], packed("a"),
         "add up to 0 bytes, but 5 bytes"),
    ],
    ids=["past-the-end", "left-over", "element-cut", "length-cut", "count", "negative", "bool",
         "both", "json-input-with-binary"],
)
def test_binary_sizes_that_do_not_add_up_are_rejected(
    inputs: list[dict[str, Any]], binary: bytes, message: str
) -> None:
    body, length = binary_request(inputs, binary)
    with pytest.raises(BadRequest, match=message):
        parse(body, json_length=length)


def test_binary_header_longer_than_the_body_is_rejected() -> None:
    body, length = binary_request([binary_text(1, 5)], packed("a"))
    with pytest.raises(BadRequest, match="larger than the body"):
        parse(body, json_length=len(body) + 1)
    with pytest.raises(BadRequest, match="malformed JSON"):  # the JSON part cut short
        parse(body, json_length=length - 1)


def test_mixed_json_and_binary_inputs_take_their_own_bytes_in_order() -> None:
    inputs: list[Any] = [
        binary_text(2, len(packed("a", "bc"))),
        {"name": "other", "datatype": "BYTES", "shape": [1], "data": ["json"]},
        binary_text(1, len(packed("déf"))),
    ]
    binary = packed("a", "bc") + packed("déf")
    chunks = oip.binary_chunks(inputs, memoryview(binary))
    assert chunks[1] is None
    assert oip.decode_bytes_elements(chunks[0], 2, "first") == ["a", "bc"]  # type: ignore[arg-type]
    assert oip.decode_bytes_elements(chunks[2], 1, "third") == ["déf"]  # type: ignore[arg-type]
    # The one-input model takes the first and says why it refuses the rest.
    body, length = binary_request(inputs, binary)
    with pytest.raises(BadRequest, match="the model takes one input"):
        parse(body, json_length=length)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "malformed JSON"),
        (b'{"inputs": ["\xff"]}', "not valid UTF-8"),
        (b'{"inputs": [{"name": "text", "data": ["\\ud800"]}]}', "UTF-8"),
        ([1, 2], "JSON object"),
        ({"inputs": []}, "non-empty list"),
        ({"id": 7} | text_input(["a"]), "'id' must be a string"),
        ({"inputs": [text_input(["a"])["inputs"][0]] * 2}, "one input"),
        ({"inputs": [{"name": "other", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
         "unknown input 'other'"),
        ({"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
         "datatype 'FP32'; expected BYTES"),
        (text_input(["a", "b", "c", "d"], shape=[2, 2]), "not supported"),
        (text_input(["a", "b"], shape=[3]), "needs 3 elements, data holds 2"),
        (text_input(["a", 5]), "element 1 is int"),
        (text_input([]), "holds no texts"),
        (text_input(["x"] * 9), "too many items: 9 texts; at most 8"),
        (text_input(["a"], shape=[-1]), "non-negative integers"),
        (text_input(["a"]) | {"outputs": [{"name": "logits"}]}, "unknown output 'logits'"),
        (text_input(["a"]) | {"parameters": []}, "'parameters' must be an object"),
    ],
)
def test_bad_requests_are_rejected_with_a_reason(body: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse(body)


def test_response_echoes_id_and_flattens_row_major() -> None:
    embeddings = (np.arange(8, dtype=np.float32) / 8).reshape(2, 4).astype(np.float32)
    request = oip.InferRequest("abc", ["a", "b"], None)
    body = orjson.loads(oip_response.encode_infer_response(
        config=CONFIG, request=request, embeddings=embeddings,
        parameters={"queue_time_ms": 1.5, "compute_time_ms": 2.0, "batch_size": 2},
    ).body)
    assert body["model_name"] == "minilm" and body["model_version"] == "1"
    assert body["id"] == "abc"
    assert body["parameters"]["batch_size"] == 2
    (output,) = body["outputs"]
    assert output["name"] == "embedding" and output["datatype"] == "FP32"
    assert output["shape"] == [2, 4]
    assert output["data"] == pytest.approx(embeddings.reshape(-1).tolist())


def test_response_reports_token_counts_as_a_second_output() -> None:
    request = oip.InferRequest(None, ["a", "b c"], None)
    body = orjson.loads(oip_response.encode_infer_response(
        config=CONFIG, request=request, embeddings=np.zeros((2, 4), np.float32),
        parameters={}, token_counts=[3, 4],
    ).body)
    names = [o["name"] for o in body["outputs"]]
    assert names == ["embedding", "token_count"]
    assert body["outputs"][1] == {"name": "token_count", "datatype": "INT32", "shape": [2],
                                  "data": [3, 4]}


def test_response_without_id_and_with_no_outputs_requested() -> None:
    request = oip.InferRequest(None, ["a"], ())
    body = orjson.loads(oip_response.encode_infer_response(
        config=CONFIG, request=request, embeddings=np.zeros((1, 4), np.float32), parameters={},
    ).body)
    assert "id" not in body
    assert body["outputs"] == []


def test_model_metadata_object() -> None:
    assert oip_response.model_metadata(CONFIG) == {
        "name": "minilm", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "token_count", "datatype": "INT32", "shape": [-1]}],
    }


@pytest.mark.parametrize(
    "value", [None, "", "application/json", "application/json; charset=utf-8",
              "application/octet-stream", "application/vnd.api+json"],
)
def test_json_and_raw_content_types_are_accepted(value: str | None) -> None:
    check_content_type(value)


@pytest.mark.parametrize("value", ["text/plain", "multipart/form-data; boundary=x"])
def test_other_content_types_are_415(value: str) -> None:
    with pytest.raises(UnsupportedMediaType):
        check_content_type(value)


def test_timeout_header() -> None:
    assert timeout_from_header(None) is None
    assert timeout_from_header("250") == 0.25
    for bad in ("0", "-5", "soon", "nan", "inf", "1e12"):
        with pytest.raises(BadRequest, match="X-Request-Timeout-Ms"):
            timeout_from_header(bad)


def test_request_id_is_echoed_when_sane() -> None:
    assert request_id("abc-123") == "abc-123"
    assert len(request_id(None)) == 32
    assert request_id("bad id with spaces") != "bad id with spaces"


def test_server_timing_header() -> None:
    assert server_timing(0.0015, 0.002) == "queue;dur=1.500, compute;dur=2.000"


def test_binary_outputs_follow_the_json_part() -> None:
    request = parse({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                 "data": ["a", "b"]}],
                     "outputs": [{"name": "embedding", "parameters": {"binary_data": True}},
                                 {"name": "token_count"}]})
    assert request.binary == frozenset({"embedding"}) and not request.binary_all
    embeddings = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    reply = oip_response.encode_infer_response(config=CONFIG, request=request,
                                               embeddings=embeddings, parameters={},
                                               token_counts=[1, 2])
    assert reply.json_length is not None
    head = orjson.loads(reply.body[:reply.json_length])
    embedding, counts = head["outputs"]
    assert embedding == {"name": "embedding", "datatype": "FP32", "shape": [2, 4],
                         "parameters": {"binary_data_size": 32}}
    assert counts["data"] == [1, 2]
    data = np.frombuffer(reply.body[reply.json_length:], dtype="<f4").reshape(2, 4)
    assert np.array_equal(data, embeddings)
    every = parse({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                   "parameters": {"binary_data_output": True}})
    assert every.wants_binary("embedding") and every.wants_binary("token_count")
    with pytest.raises(BadRequest, match="binary_data_output"):
        parse({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
               "parameters": {"binary_data_output": 1}})
