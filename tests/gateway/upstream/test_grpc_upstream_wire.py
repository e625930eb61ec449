"""The gRPC upstream's translation (pure): REST requests as calls, answers as REST answers,
status codes as REST statuses that count as REST's do; the scheme dispatch; the message layout
against tritonclient's copy of Triton's grpc_service.proto."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.errors import BadGateway, DeadlineExceeded, Overloaded
from gateway.routing import BackendSpec, Router, RoutingSettings
from gateway.upstream import grpc_answer as ga
from gateway.upstream import grpc_wire as gw
from gateway.upstream.grpc import SCHEME, GrpcTransport, channel_options
from gateway.upstream.health import HealthChecker
from gateway.upstream.transport import (
    ConnectFailed,
    ConnectTimeout,
    MemoryTransport,
    Reply,
    Request,
    Reset,
    SchemeTransport,
    TransportError,
)
from gateway.upstream.wire import (
    Retryable,
    infer_request_body,
    parse_embeddings,
    server_timing,
    status_outcome,
)
from oip import inference_pb2 as pb

TIMING = (("server-timing", "queue;dur=0.5, compute;dur=2.25"), ("x-request-id", "rid-1"))


def call_of(method: str, path: str, body: bytes | None = None) -> gw.RpcCall:
    call = gw.to_call(method, path, body)
    assert isinstance(call, gw.RpcCall), call
    return call


def response(vectors: np.ndarray, counts: list[int]) -> pb.ModelInferResponse:
    """A ModelInferResponse as our backend (and Triton) answers: every output raw."""
    message = pb.ModelInferResponse(model_name="minilm", model_version="1", id="")
    message.parameters["queue_time_ms"].double_param = 0.5
    message.parameters["compute_time_ms"].double_param = 2.25
    message.parameters["batch_size"].int64_param = len(counts)
    message.outputs.add(name="embedding", datatype="FP32", shape=vectors.shape)
    message.raw_output_contents.append(vectors.astype("<f4").tobytes())
    message.outputs.add(name="token_count", datatype="INT32", shape=[len(counts)])
    message.raw_output_contents.append(np.asarray(counts, "<i4").tobytes())
    return message


# --- requests ------------------------------------------------------------------------------


def test_routes_become_the_three_calls() -> None:
    ready = call_of("GET", "/v2/health/ready")
    assert ready.method == "ServerReady"
    meta = call_of("GET", "/v2/models/minilm")
    assert meta.method == "ModelMetadata" and meta.message.name == "minilm"
    assert meta.message.version == ""
    meta = call_of("GET", "/v2/models/minilm/versions/3")
    assert (meta.message.name, meta.message.version) == ("minilm", "3")
    infer = call_of("POST", "/v2/models/a%20b/versions/2/infer", infer_request_body(["x"]))
    assert infer.method == "ModelInfer"
    assert (infer.message.model_name, infer.message.model_version) == ("a b", "2")


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v2/health/live", 404), ("GET", "/metrics", 404), ("GET", "/v2/models/", 404),
    ("GET", "/v2/models/m/infer/x", 404), ("POST", "/v2/health/ready", 405),
    ("POST", "/v2/models/m", 405), ("GET", "/v2/models/m/infer", 405),
])
def test_a_route_without_a_call_is_answered_as_rest_would(method: str, path: str,
                                                          status: int) -> None:
    reply = gw.to_call(method, path, b"{}")
    assert isinstance(reply, Reply) and reply.status == status
    assert orjson.loads(reply.body)["error"]


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"inputs": 3}', b'{"inputs": [{"name": "t"}]}',
    b'{"inputs": [{"name": "t", "datatype": "NOPE", "shape": [1], "data": [1]}]}',
    b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": [["x"]]}]}',
    b'{"inputs": [], "parameters": {"p": [1]}}',
])
def test_a_body_that_is_not_an_infer_request_is_a_400(body: bytes) -> None:
    reply = gw.to_call("POST", "/v2/models/m/infer", body)
    assert isinstance(reply, Reply) and reply.status == 400


def test_texts_go_raw_as_length_prefixed_utf8_and_binary_output_is_remembered() -> None:
    texts = ["héllo", "", "wörld " * 3]
    call = call_of("POST", "/v2/models/minilm/infer", infer_request_body(texts))
    message = call.message
    (tensor,) = message.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("text", "BYTES", [3])
    assert not tensor.contents.bytes_contents  # data only in raw_input_contents
    raw = message.raw_input_contents[0]
    want = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    assert raw == want
    assert "binary_data_output" not in message.parameters  # REST's extension stays here
    assert call.render.all_binary and call.render.is_binary("embedding")


def test_ids_parameters_outputs_and_numeric_inputs_translate() -> None:
    body = orjson.dumps({
        "id": "req-9",
        "parameters": {"flag": True, "n": 3, "big": 2**63, "x": 0.5, "s": "v"},
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"],
             "parameters": {"binary_data_size": 5, "tag": "t"}},
            {"name": "ids", "datatype": "INT64", "shape": [2], "data": [1, -2]},
        ],
        "outputs": [{"name": "embedding", "parameters": {"binary_data": True, "top": 1}},
                    {"name": "token_count", "parameters": {"binary_data": False}},
                    {"name": "other"}],
    })
    call = call_of("POST", "/v2/models/m/infer", body)
    message = call.message
    assert message.id == "req-9"
    params = message.parameters
    assert params["flag"].bool_param is True and params["n"].int64_param == 3
    assert params["big"].uint64_param == 2**63 and params["x"].double_param == 0.5
    assert params["s"].string_param == "v"
    assert dict(message.inputs[0].parameters).keys() == {"tag"}
    assert np.frombuffer(message.raw_input_contents[1], "<i8").tolist() == [1, -2]
    assert [o.name for o in message.outputs] == ["embedding", "token_count", "other"]
    assert dict(message.outputs[0].parameters).keys() == {"top"}
    render = call.render
    assert not render.all_binary
    assert render.is_binary("embedding") and not render.is_binary("token_count")
    assert not render.is_binary("other")


# --- answers -------------------------------------------------------------------------------


def test_a_binary_answer_is_what_parse_embeddings_reads_with_the_raw_bytes_untouched() -> None:
    vectors = np.random.default_rng(1).standard_normal((2, 384)).astype(np.float32)
    call = call_of("POST", "/v2/models/minilm/infer", infer_request_body(["a", "b"]))
    reply = ga.infer_reply(response(vectors, [4, 7]), call.render, TIMING)
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/octet-stream"
    header_len = int(reply.headers[gw.BINARY_HEADER])
    assert reply.body[header_len:header_len + vectors.nbytes] == vectors.tobytes()
    answer = parse_embeddings(reply.body, reply.headers, 2, "b1")
    assert np.array_equal(answer.vectors, vectors)
    assert answer.token_counts == [4, 7] and answer.model_version == "1"
    assert (answer.queue_ms, answer.compute_ms) == (0.5, 2.25)
    assert server_timing(reply.headers) == {"queue": 0.5, "compute": 2.25}
    assert reply.headers["x-request-id"] == "rid-1"


def test_a_json_answer_is_the_rest_backends_json() -> None:
    vectors = np.random.default_rng(2).standard_normal((1, 384)).astype(np.float32)
    call = call_of("POST", "/v2/models/minilm/infer", orjson.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}))
    message = response(vectors, [3])
    message.id = "abc"
    reply = ga.infer_reply(message, call.render, TIMING)
    assert reply.headers["Content-Type"] == "application/json"
    assert gw.BINARY_HEADER not in reply.headers
    doc = orjson.loads(reply.body)
    assert doc["model_name"] == "minilm" and doc["model_version"] == "1" and doc["id"] == "abc"
    assert doc["parameters"] == {"queue_time_ms": 0.5, "compute_time_ms": 2.25, "batch_size": 1}
    embedding, counts = doc["outputs"]
    assert embedding["shape"] == [1, 384] and embedding["datatype"] == "FP32"
    assert np.array_equal(np.asarray(embedding["data"], np.float32), vectors.ravel())
    assert counts == {"name": "token_count", "datatype": "INT32", "shape": [1], "data": [3]}
    assert np.array_equal(parse_embeddings(reply.body, reply.headers, 1, "b").vectors, vectors)


def test_outputs_mixed_bytes_and_typed_contents() -> None:
    message = pb.ModelInferResponse(model_name="m", model_version="2")
    message.outputs.add(name="label", datatype="BYTES", shape=[2])
    message.outputs.add(name="score", datatype="FP32", shape=[2])
    message.raw_output_contents.append(b"\x03\x00\x00\x00cat\x00\x00\x00\x00")
    message.raw_output_contents.append(np.asarray([0.25, 0.5], "<f4").tobytes())
    render = gw.Render(binary=frozenset({"score"}))
    reply = ga.infer_reply(message, render, ())
    header = int(reply.headers[gw.BINARY_HEADER])
    doc = orjson.loads(reply.body[:header])
    assert doc["outputs"][0]["data"] == ["cat", ""]
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(reply.body[header:], "<f4").tolist() == [0.25, 0.5]
    typed = pb.ModelInferResponse(model_name="m")  # data in contents, not raw (older servers)
    typed.outputs.add(name="score", datatype="FP32", shape=[2]).contents.fp32_contents.extend(
        [1.5, 2.5])
    doc = orjson.loads(ga.infer_reply(typed, gw.Render(), ()).body)
    assert doc["outputs"][0]["data"] == [1.5, 2.5]
    reply = ga.infer_reply(typed, gw.Render(all_binary=True), ())
    assert reply.body.endswith(np.asarray([1.5, 2.5], "<f4").tobytes())


@pytest.mark.parametrize("breakage", ["count", "size", "bytes"])
def test_raw_data_that_does_not_fit_is_a_malformed_answer(breakage: str) -> None:
    message = response(np.zeros((1, 384), np.float32), [1])
    if breakage == "count":
        message.raw_output_contents.pop()
    elif breakage == "size":
        message.raw_output_contents[0] = b"\x00" * 12
    else:
        message.outputs[1].datatype = "BYTES"
        message.raw_output_contents[1] = b"\x09\x00\x00\x00ab"
    with pytest.raises(ga.MalformedAnswer):
        ga.infer_reply(message, gw.Render(), ())
    if breakage == "size":
        with pytest.raises(ga.MalformedAnswer):
            ga.infer_reply(message, gw.Render(all_binary=True), ())


def test_ready_and_metadata_answers() -> None:
    assert gw.ready_reply(pb.ServerReadyResponse(ready=True), ()).status == 200
    not_ready = gw.ready_reply(pb.ServerReadyResponse(ready=False), ())
    assert not_ready.status == 503 and orjson.loads(not_ready.body) == {"ready": False}
    meta = pb.ModelMetadataResponse(name="minilm", versions=["1"], platform="onnxruntime_onnx")
    meta.inputs.add(name="text", datatype="BYTES", shape=[-1])
    meta.outputs.add(name="embedding", datatype="FP32", shape=[-1, 384])
    reply = gw.metadata_reply(meta, TIMING)
    assert reply.status == 200 and reply.headers["X-Request-Id"] == "rid-1"
    assert orjson.loads(reply.body) == {
        "name": "minilm", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]}


# --- status codes --------------------------------------------------------------------------

SERVER = (("x-request-id", "rid-7"),)  # what the backend's aborts always carry


@pytest.mark.parametrize(("code", "details", "trailing", "status", "outcome", "error"), [
    ("RESOURCE_EXHAUSTED", "queue full", (*SERVER, ("retry-after", "7")), 503, "overloaded",
     Overloaded),
    ("UNAVAILABLE", "warming up", (*SERVER, ("retry-after", "2")), 503, "overloaded",
     Overloaded),
    ("DEADLINE_EXCEEDED", "deadline passed in the queue", SERVER, 504, "gateway_error",
     DeadlineExceeded),
    ("INVALID_ARGUMENT", "bad shape", SERVER, 400, "ok", None),
    ("NOT_FOUND", "unknown model", SERVER, 404, "ok", None),
    ("RESOURCE_EXHAUSTED", "Received message larger than max (9 vs. 4)", (), 413, "ok", None),
    ("INTERNAL", "boom", SERVER, 500, "error", BadGateway),
    ("UNKNOWN", "", (), 500, "error", BadGateway),
    ("CANCELLED", "gone", SERVER, 500, "error", BadGateway),
    ("UNIMPLEMENTED", "no such method", (), 501, "error", BadGateway),
])
def test_status_codes_count_and_map_as_the_rest_statuses_do(
    code: str, details: str, trailing: tuple[tuple[str, str], ...], status: int, outcome: str,
    error: type[Exception] | None,
) -> None:
    reply = gw.status_reply(code, details, trailing)
    assert reply.status == status
    if details:
        assert orjson.loads(reply.body)["error"] == details
    got_outcome, got_error = status_outcome(reply.status, reply.headers, reply.body, "b1")
    assert got_outcome == outcome
    if error is None:
        assert got_error is None
        return
    assert isinstance(got_error, Retryable)
    assert isinstance(got_error.error, error)
    if isinstance(got_error.error, Overloaded):
        want = float(dict(trailing).get("retry-after", "1"))
        assert got_error.error.retry_after_s == want


def test_resource_exhausted_without_retry_after_waits_one_second() -> None:
    reply = gw.status_reply("RESOURCE_EXHAUSTED", "full", SERVER)
    assert reply.status == 503 and reply.headers["Retry-After"] == "1"


@pytest.mark.parametrize(("details", "error"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "
     "Failed to connect to remote host: Connection refused", ConnectFailed),
    ("DNS resolution failed for nowhere.invalid:1", ConnectFailed),
    ("Socket closed", Reset),
    ("recvmsg:Connection reset by peer", Reset),
])
def test_unavailable_from_the_channel_is_a_connection_failure(details: str,
                                                              error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        gw.status_reply("UNAVAILABLE", details, ())
    assert type(info.value) is error


# --- the transport and the seam ------------------------------------------------------------


def test_channel_options_keep_alive_and_reconnect_fast() -> None:
    options = dict(channel_options(connect_timeout_s=0.5))
    assert options["grpc.keepalive_time_ms"] >= 10_000  # gRPC's floor for client pings
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.min_reconnect_backoff_ms"] == 500
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert options["grpc.enable_retries"] == 0


async def test_the_grpc_transport_refuses_other_urls_and_answers_unknown_routes() -> None:
    transport = GrpcTransport(connect_timeout_s=0.5)
    with pytest.raises(TransportError):
        await transport.send(Request("GET", "http://127.0.0.1:1/v2/health/ready"), timeout_s=1)
    reply = await transport.send(Request("GET", f"{SCHEME}127.0.0.1:1/metrics"), timeout_s=1)
    assert reply.status == 404  # answered here: no channel, no call
    await transport.close()
    with pytest.raises(TransportError):
        await transport.send(Request("GET", f"{SCHEME}127.0.0.1:1/v2/health/ready"),
                             timeout_s=1)


def answering(tag: str) -> Callable[[Request], Awaitable[Reply]]:
    async def handler(request: Request) -> Reply:
        return Reply(200, tag.encode(), {})

    return handler


async def test_the_scheme_transport_sends_each_url_to_its_protocol() -> None:
    http, grpc = MemoryTransport(answering("http")), MemoryTransport(answering("grpc"))
    transport = SchemeTransport({"http": http, "https": http, "grpc": grpc})
    for url, want in (("http://a:1/x", b"http"), ("https://a/x", b"http"),
                      ("grpc://a:2/x", b"grpc")):
        assert (await transport.send(Request("GET", url), timeout_s=1)).body == want
    assert [r.url for r in http.requests] == ["http://a:1/x", "https://a/x"]
    with pytest.raises(TransportError):
        await transport.send(Request("GET", "ftp://a/x"), timeout_s=1)
    await transport.close()


def test_backend_specs_take_grpc_urls_with_a_port() -> None:
    spec = BackendSpec.parse("grpc://10.0.0.1:8002/@eu/eu-1a")
    assert (spec.url, spec.label, spec.zone) == ("grpc://10.0.0.1:8002", "10.0.0.1:8002", "eu-1a")
    with pytest.raises(ValueError, match="needs its port"):
        BackendSpec(url="grpc://10.0.0.1")


async def test_health_counts_a_connect_timeout_as_a_timeout_and_a_refusal_at_once() -> None:
    failure: list[Exception] = []

    async def handler(request: Request) -> Reply:
        if failure:
            raise failure[0]
        if request.url.endswith("/ready"):
            return Reply(200, b"{}", {})
        return Reply(200, b'{"versions": ["1"]}', {})

    settings = RoutingSettings(unhealthy_threshold=2)
    router = Router([BackendSpec(url="grpc://127.0.0.1:9")], settings)
    checker = HealthChecker(router, MemoryTransport(handler), settings, models=("minilm",))
    await checker.check_once()
    (state,) = router.states
    assert state.healthy and state.model_versions == {"minilm": "1"}
    failure.append(ConnectTimeout("connect timeout"))
    await checker.check_once()
    assert state.healthy  # one timeout is under the threshold
    failure[0] = ConnectFailed("refused")
    await checker.check_once()
    assert not state.healthy


# --- wire compatibility --------------------------------------------------------------------


def _fields(descriptor: Any) -> dict[str, tuple[int, int, bool, str]]:
    found = {}
    for field in descriptor.fields:
        kind = field.message_type.name if field.message_type else ""
        found[field.name] = (field.number, field.type, field.label == field.LABEL_REPEATED, kind)
    return found


@pytest.mark.parametrize("name", [
    "ServerReadyRequest", "ServerReadyResponse", "ModelMetadataRequest", "ModelMetadataResponse",
    "InferParameter", "InferTensorContents", "ModelInferRequest", "ModelInferResponse",
])
def test_messages_have_tritons_field_numbers_and_types(name: str) -> None:
    from tritonclient.grpc import service_pb2 as triton

    ours, theirs = getattr(pb, name).DESCRIPTOR, getattr(triton, name).DESCRIPTOR
    pending = [(ours, theirs)]
    while pending:  # nested messages too
        mine, reference = pending.pop()
        mine_fields, reference_fields = _fields(mine), _fields(reference)
        for field, layout in mine_fields.items():
            assert reference_fields.get(field) == layout, (mine.full_name, field)
        for nested in mine.nested_types:
            pending.append((nested, reference.nested_types_by_name[nested.name]))
    assert ours.full_name == f"edge.oip.{name}"


def test_the_translation_round_trips_a_tritonclient_request() -> None:
    """What the transport sends parses as tritonclient's message, field for field."""
    from tritonclient.grpc import service_pb2 as triton

    call = call_of("POST", "/v2/models/minilm/infer", infer_request_body(["one", "two"]))
    theirs = triton.ModelInferRequest.FromString(call.message.SerializeToString())
    assert theirs.model_name == "minilm" and list(theirs.inputs[0].shape) == [2]
    raw = theirs.raw_input_contents[0]
    assert raw == b"\x03\x00\x00\x00one\x03\x00\x00\x00two"
    assert math.prod(theirs.inputs[0].shape) == 2
