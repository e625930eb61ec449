"""The three model variants: fused fp32 (CPU default), dynamic int8 (CPU), fp16 (GPU).

All three keep the signature of ``bert_graph`` (int64 inputs, float32 output).

- fp32: ONNX Runtime's transformer optimiser fuses each layer's attention into one
  ``Attention`` node and the FFN bias + GELU into ``BiasGelu``. Add + LayerNormalization is
  left unfused on purpose: on the (AVX-512, 2-core) CPU this was measured on, the fused
  ``SkipLayerNormalization`` graph was no faster at batch 1 and about 10% slower at batch 32.
- int8: dynamic quantisation, per-channel int8 weights, of the fused fp32 graph (Attention
  becomes QAttention, MatMul becomes MatMulInteger). The embedding table stays fp32: it costs no
  compute and quantising it lost accuracy. Activation scales are computed per batch, so results
  vary slightly with what else is in the batch.
- fp16: the fully fused graph (SkipLayerNormalization too: on a GPU every kernel launch counts),
  converted by ``to_float16`` below. The pooling and normalisation stay float32.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backend.modelbuild.bert_graph import POOLING_PREFIX
from backend.modelbuild.errors import ModelBuildError
from backend.modelbuild.weights import BertConfig

VARIANTS = ("fp32", "int8", "fp16")
FILENAMES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}

_MS_DOMAIN = "com.microsoft"
_FP16_MAX = float(np.finfo(np.float16).max)


@contextmanager
def _quiet_onnxruntime_tools() -> Iterator[None]:
    """ORT's Python tools log advice meant for PyTorch exports (wrong producer, no sympy,
    "run pre-processing first") through a dozen module-level loggers and the root logger;
    none of it applies to a graph built here. Errors still get through."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def fuse(model: onnx.ModelProto, config: BertConfig, *, skip_layer_norm: bool) -> onnx.ModelProto:
    """A fused copy: attention and BiasGelu (and Add + LayerNorm when ``skip_layer_norm``)."""
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    # Symbolic shape inference would need sympy, which nothing else here uses; the fusions
    # below match this graph without it.
    options.enable_shape_inference = False
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    options.enable_skip_layer_norm = skip_layer_norm
    options.enable_bias_skip_layer_norm = skip_layer_norm
    options.enable_embed_layer_norm = False
    try:
        with _quiet_onnxruntime_tools():
            # opt_level 0: Python fusions only. Higher levels first run an ORT session and
            # then import torch, which this project never installs.
            # The optimiser rewrites the proto it is given, so it gets a copy.
            optimized: onnx.ModelProto = optimize_model(
                _copy(model), model_type="bert", num_heads=config.num_heads,
                hidden_size=config.hidden_size, optimization_options=options, opt_level=0,
            ).model
    except Exception as exc:  # the optimiser raises whatever its fusions hit
        raise ModelBuildError(f"ONNX Runtime's transformer optimiser failed: {exc}") from exc
    fused = sum(node.op_type == "Attention" for node in optimized.graph.node)
    if fused != config.num_layers:
        raise ModelBuildError(
            f"ONNX Runtime fused {fused} of {config.num_layers} attention blocks; "
            "the graph no longer matches the optimiser's patterns"
        )
    if not any(op.domain == _MS_DOMAIN for op in optimized.opset_import):
        optimized.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    return optimized


def quantize_int8(model: onnx.ModelProto, out: Path) -> None:
    """Writes the dynamic per-channel int8 variant of a fused fp32 graph to ``out``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        with _quiet_onnxruntime_tools():
            quantize_dynamic(
                _copy(model), out, per_channel=True, weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Attention"],
                extra_options={
                    # Fused com.microsoft nodes defeat ONNX shape inference; their outputs
                    # are float.
                    "DefaultTensorType": TensorProto.FLOAT,
                    # Quantise weights only: activation x activation products (none remain
                    # after fusion) would lose the most accuracy.
                    "MatMulConstBOnly": True,
                },
            )
    except Exception as exc:  # the quantiser raises RuntimeError, ValueError, onnx errors...
        raise ModelBuildError(f"dynamic int8 quantisation failed: {exc}") from exc


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The encoder in fp16; pooling (``POOLING_PREFIX`` nodes) and the output stay float32.

    ONNX Runtime's generic converter mis-handles this graph (it re-casts between blocked nodes
    and leaves scalar constants in float32), so this one is written for the graph we build:
    every encoder op is type-polymorphic, so turning each float initializer, Constant and
    Cast-to-float of the encoder into fp16 gives a consistent fp16 encoder, and one Cast back
    to float32 sits where the encoder's output enters the pooling.
    """
    converted = _copy(model)
    graph = converted.graph
    pooling = [n for n in graph.node if n.name.startswith(POOLING_PREFIX)]
    encoder = [n for n in graph.node if not n.name.startswith(POOLING_PREFIX)]
    keep_fp32 = {name for node in pooling for name in node.input}

    for index, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT and init.name not in keep_fp32:
            graph.initializer[index].CopyFrom(_half(init))
    for node in encoder:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
            if node.op_type == "Constant" and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(_half(attr.t))

    encoder_outputs = {out for node in encoder for out in node.output}
    crossing = sorted(keep_fp32 & encoder_outputs)
    if len(crossing) != 1:
        raise ModelBuildError(f"expected one encoder output feeding the pooling, got {crossing}")
    hidden = crossing[0]
    cast = helper.make_node("Cast", [hidden], [f"{hidden}_fp32"],
                            name=f"{POOLING_PREFIX}Cast_encoder_fp32", to=TensorProto.FLOAT)
    for node in pooling:
        node.input[:] = [f"{hidden}_fp32" if name == hidden else name for name in node.input]
    producer = next(i for i, node in enumerate(graph.node) if hidden in node.output)
    graph.node.insert(producer + 1, cast)
    # Types of intermediate values changed; ORT infers them again at load.
    del graph.value_info[:]
    return converted


def _half(tensor: onnx.TensorProto) -> onnx.TensorProto:
    values = numpy_helper.to_array(tensor)
    clipped = np.clip(values, -_FP16_MAX, _FP16_MAX).astype(np.float16)
    return numpy_helper.from_array(clipped, tensor.name)
