"""The BERT sentence encoder as an ONNX graph (opset 17), built straight from its tensors.

No PyTorch: every node is written with ``onnx.helper``. The graph is laid out the way a
PyTorch export of Hugging Face BERT is (Q/K/V MatMul+Add+Reshape+Transpose, Div by sqrt(d),
additive mask from ``(1 - mask) * -10000``, Erf GELU, Add before each LayerNormalization),
because that is the shape ONNX Runtime's transformer optimiser recognises and fuses into
Attention / SkipLayerNormalization / BiasGelu kernels (see ``variants.py``).

Signature (docs/ARCHITECTURE.md): inputs ``input_ids`` and ``attention_mask``, int64
[batch, seq]; output ``sentence_embedding``, float32 [batch, dim], mean-pooled over the mask and
L2-normalised. ``token_type_ids`` is always zero for single sentences, so the type-0 embedding
row is folded into the position table and no third input exists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backend.modelbuild.errors import ModelBuildError
from backend.modelbuild.weights import BertConfig, FloatArray

OPSET = 17
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
OUTPUT = "sentence_embedding"
# Nodes after the encoder (pooling and normalisation) carry this prefix so that the fp16
# conversion can keep them in float32: a sum over up to 256 tokens and a norm are where half
# precision would lose the most.
POOLING_PREFIX = "pooling/"

# The classic BERT mask value; fused Attention uses it by default, and unlike float32's
# minimum it stays finite when the graph is converted to fp16.
_MASK_VALUE = -10000.0


class _Graph:
    """Accumulates nodes and initializers, naming every node uniquely."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], *, prefix: str = "", out: str = "",
           **attrs: Any) -> str:
        self._count += 1
        name = f"{prefix}{op_type}_{self._count}"
        output = out or f"{name}_out"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output


def build_bert_graph(config: BertConfig, tensors: Mapping[str, FloatArray]) -> onnx.ModelProto:
    """The full encoder with mean pooling and L2 normalisation, checked by ``onnx.checker``."""
    try:
        g = _Graph()
        mask_bias = _embed_mask(g, config)
        hidden = _embeddings(g, config, tensors)
        for layer in range(config.num_layers):
            prefix = f"encoder.layer.{layer}."
            hidden = _encoder_layer(g, config, tensors, prefix, hidden, mask_bias)
        _pool_and_normalise(g, hidden)
    except KeyError as exc:
        raise ModelBuildError(f"the weights have no tensor {exc}") from exc

    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        g.nodes,
        "sentence_encoder",
        inputs=[
            helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, dims),
            helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, dims),
        ],
        outputs=[
            helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", config.hidden_size])
        ],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="backend.modelbuild"
    )
    model.ir_version = 8  # opset 17's IR version: loadable by every ONNX Runtime since 1.13
    onnx.checker.check_model(model)
    return model


def _f32(value: float | list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _i64(value: list[int]) -> np.ndarray:
    return np.asarray(value, dtype=np.int64)


def _embed_mask(g: _Graph, config: BertConfig) -> str:
    """[B, S] 0/1 mask -> [B, 1, 1, S] additive bias, in the pattern the optimiser matches."""
    unsq1 = g.op("Unsqueeze", [ATTENTION_MASK, g.const("mask_axis1", _i64([1]))])
    unsq2 = g.op("Unsqueeze", [unsq1, g.const("mask_axis2", _i64([2]))])
    as_float = g.op("Cast", [unsq2], to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("mask_one", _f32(1.0)), as_float])
    return g.op("Mul", [inverted, g.const("mask_value", _f32(_MASK_VALUE))])


def _embeddings(g: _Graph, config: BertConfig, t: Mapping[str, FloatArray]) -> str:
    # token_type_ids are all zero: adding type row 0 to every position row is exact folding.
    pos_table = (t["embeddings.position_embeddings.weight"]
                 + t["embeddings.token_type_embeddings.weight"][0])
    words = g.op("Gather", [g.const("word_embeddings", t["embeddings.word_embeddings.weight"]),
                            INPUT_IDS], axis=0)
    seq_len = g.op("Shape", [INPUT_IDS], start=1, end=2)
    pos = g.op("Slice", [g.const("position_embeddings", pos_table.astype(np.float32)),
                         g.const("zero", _i64([0])), seq_len, g.const("axis0", _i64([0]))])
    summed = g.op("Add", [words, pos])
    return _layer_norm(g, config, t, "embeddings.LayerNorm", summed)


def _layer_norm(g: _Graph, config: BertConfig, t: Mapping[str, FloatArray], name: str,
                x: str) -> str:
    return g.op("LayerNormalization",
                [x, g.const(f"{name}.weight", t[f"{name}.weight"]),
                 g.const(f"{name}.bias", t[f"{name}.bias"])],
                axis=-1, epsilon=config.layer_norm_eps)


def _linear(g: _Graph, t: Mapping[str, FloatArray], name: str, x: str) -> str:
    # torch Linear stores [out, in]; MatMul wants [in, out].
    weight = np.ascontiguousarray(t[f"{name}.weight"].T)
    product = g.op("MatMul", [x, g.const(f"{name}.weight_t", weight)])
    return g.op("Add", [product, g.const(f"{name}.bias", t[f"{name}.bias"])])


def _encoder_layer(g: _Graph, config: BertConfig, t: Mapping[str, FloatArray], p: str,
                   x: str, mask_bias: str) -> str:
    heads, head_size = config.num_heads, config.head_size
    split = g.const(f"{p}split_heads", _i64([0, 0, heads, head_size]))
    merge = g.const(f"{p}merge_heads", _i64([0, 0, config.hidden_size]))

    def project(kind: str, perm: list[int]) -> str:
        linear = _linear(g, t, f"{p}attention.self.{kind}", x)
        return g.op("Transpose", [g.op("Reshape", [linear, split])], perm=perm)

    q = project("query", [0, 2, 1, 3])
    k = project("key", [0, 2, 3, 1])  # K already transposed for Q @ K^T
    v = project("value", [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k]),
                          g.const(f"{p}scale", _f32(math.sqrt(head_size)))])
    probs = g.op("Softmax", [g.op("Add", [scores, mask_bias])], axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    attended = _linear(g, t, f"{p}attention.output.dense", g.op("Reshape", [context, merge]))
    x = _layer_norm(g, config, t, f"{p}attention.output.LayerNorm",
                    g.op("Add", [attended, x]))

    inter = _linear(g, t, f"{p}intermediate.dense", x)
    erf = g.op("Erf", [g.op("Div", [inter, g.const(f"{p}sqrt2", _f32(math.sqrt(2.0)))])])
    gelu = g.op("Mul", [g.op("Mul", [inter, g.op("Add", [erf, g.const(f"{p}one", _f32(1.0))])]),
                        g.const(f"{p}half", _f32(0.5))])
    out = _linear(g, t, f"{p}output.dense", gelu)
    return _layer_norm(g, config, t, f"{p}output.LayerNorm", g.op("Add", [out, x]))


def _pool_and_normalise(g: _Graph, hidden: str) -> None:
    """Mean over unmasked tokens, then x / max(||x||, 1e-12) as torch's normalize does."""
    p = POOLING_PREFIX
    mask = g.op("Unsqueeze", [g.op("Cast", [ATTENTION_MASK], prefix=p, to=TensorProto.FLOAT),
                              g.const("pool_axis_last", _i64([-1]))], prefix=p)
    axis1 = g.const("pool_axis1", _i64([1]))
    summed = g.op("ReduceSum", [g.op("Mul", [hidden, mask], prefix=p), axis1],
                  prefix=p, keepdims=0)
    count = g.op("ReduceSum", [mask, axis1], prefix=p, keepdims=0)
    # sentence-transformers clamps the token count at 1e-9.
    count = g.op("Max", [count, g.const("pool_min_count", _f32(1e-9))], prefix=p)
    mean = g.op("Div", [summed, count], prefix=p)
    square_sum = g.op("ReduceSum", [g.op("Mul", [mean, mean], prefix=p), axis1],
                      prefix=p, keepdims=1)
    norm = g.op("Max", [g.op("Sqrt", [square_sum], prefix=p),
                        g.const("pool_min_norm", _f32(1e-12))], prefix=p)
    g.op("Div", [mean, norm], prefix=p, out=OUTPUT)
