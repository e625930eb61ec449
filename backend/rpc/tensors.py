"""gRPC inference messages to and from the data plane's terms: the gRPC twin of ``oip.py``.

``ModelInferRequest`` -> ``oip.InferRequest`` with the same rules and messages as over REST
(``oip.check_tensor``, ``oip.decode_bytes_elements``); texts come raw in
``raw_input_contents`` (what tritonclient sends) or as ``contents.bytes_contents``. Responses
carry every output in ``raw_output_contents``, as Triton answers: little-endian FP32 embeddings
and INT32 token counts, which clients read with one ``numpy.frombuffer`` each.

Pure functions: no grpc, no I/O. Every rule broken raises ``BadRequest``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from backend import oip, oip_response
from backend.errors import BadRequest
from backend.repository import ModelConfig, TensorSpec
from backend.scheduling.params import parse_schedule
from oip import inference_pb2 as pb


def parse_infer_request(
    message: pb.ModelInferRequest,
    *,
    input_spec: TensorSpec,
    output_names: Sequence[str],
    max_items: int,
) -> oip.InferRequest:
    """Validates a ``ModelInferRequest`` for a one-BYTES-input text model."""
    inputs = message.inputs
    if not inputs:
        raise BadRequest("'inputs' must hold one input tensor")
    raw = message.raw_input_contents
    if raw and len(raw) != len(inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(inputs)} inputs")
    if len(inputs) != 1:
        raise BadRequest(f"the model takes one input ({input_spec.name!r}), got {len(inputs)}")
    tensor = inputs[0]
    count = oip.check_tensor(tensor.name, tensor.datatype, list(tensor.shape), input_spec)
    elements = tensor.contents.bytes_contents
    if raw:
        if elements:
            raise BadRequest(f"input {input_spec.name!r} has both contents and "
                             "raw_input_contents")
        texts = oip.decode_bytes_elements(memoryview(raw[0]), count, input_spec.name)
    else:
        texts = _texts(elements, count, input_spec.name)
    if not texts:
        raise BadRequest(f"input {input_spec.name!r} holds no texts")
    if len(texts) > max_items:
        raise BadRequest(f"too many items: {len(texts)} texts; at most {max_items} per request")
    names = [*output_names, oip.TOKEN_COUNT]
    wanted: list[str] = []
    for output in message.outputs:
        if output.name not in names:
            raise BadRequest(f"unknown output {output.name!r}: the model's outputs are "
                             f"{', '.join(names)}")
        wanted.append(output.name)
    return oip.InferRequest(message.id or None, texts, tuple(wanted) if wanted else None,
                            schedule=parse_schedule(_values(message.parameters)))


def _values(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    """A parameters map's plain values (whichever of the oneof is set)."""
    out: dict[str, object] = {}
    for name, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is not None:
            out[name] = getattr(parameter, which)
    return out


def _texts(elements: Sequence[bytes], count: int, name: str) -> list[str]:
    if len(elements) != count:
        raise BadRequest(f"input {name!r}: shape needs {count} elements, contents hold "
                         f"{len(elements)}")
    texts: list[str] = []
    for index, element in enumerate(elements):
        try:
            texts.append(element.decode("utf-8"))
        except UnicodeDecodeError:
            raise BadRequest(f"input {name!r}: element {index} is not valid UTF-8") from None
    return texts


def encode_infer_response(
    *,
    config: ModelConfig,
    request: oip.InferRequest,
    embeddings: npt.NDArray[np.float32],
    token_counts: Sequence[int],
    parameters: Mapping[str, float | int],
) -> pb.ModelInferResponse:
    """The ``ModelInferResponse``: the requested outputs, data in ``raw_output_contents``."""
    response = pb.ModelInferResponse(model_name=config.name, model_version=config.version,
                                     id=request.id or "")
    for key, value in parameters.items():
        if isinstance(value, int):
            response.parameters[key].int64_param = value
        else:
            response.parameters[key].double_param = value
    spec = config.output
    if request.outputs is None or spec.name in request.outputs:
        response.outputs.add(name=spec.name, datatype=spec.datatype, shape=embeddings.shape)
        response.raw_output_contents.append(
            np.ascontiguousarray(embeddings, dtype="<f4").tobytes())
    if request.outputs is None or oip.TOKEN_COUNT in request.outputs:
        response.outputs.add(name=oip.TOKEN_COUNT, datatype="INT32", shape=[len(token_counts)])
        response.raw_output_contents.append(np.asarray(token_counts, dtype="<i4").tobytes())
    return response


def model_metadata(config: ModelConfig) -> pb.ModelMetadataResponse:
    """The ``ModelMetadataResponse``: the same tensors as REST's model metadata."""
    meta = oip_response.model_metadata(config)
    response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                        platform=meta["platform"])
    for field, tensors in (("inputs", meta["inputs"]), ("outputs", meta["outputs"])):
        for tensor in tensors:
            getattr(response, field).add(name=tensor["name"], datatype=tensor["datatype"],
                                         shape=tensor["shape"])
    return response
