"""What ``bench/gpu_check.sh`` takes to a GPU machine, and the fp32 graph it builds there.

The device machine has no network and takes at most 64 MiB of files from here. The fp16 graph
(45 MB), the tokenizer and the config fit; the fp32 graph (90 MB) does not. So
``python -m bench gpu_check --prepare`` copies the fp16 variant into ``.bench/gpu-models``
(git-ignored) and downloads the wheels that machine's Python lacks into ``.whl``, and the check
*builds* an fp32 graph there with ``upcast``: the fp16 graph with every fp16 weight and cast
turned back into fp32. Its weights are the fp16-rounded ones, so "fp16 vs fp32" there measures
what fp16 *compute* costs; the reference embeddings (``tests/fixtures``, sentence-transformers
in fp32) measure the whole fp16 variant against the original model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import orjson
from onnx import TensorProto, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
CARRY_MODELS = ROOT / ".bench" / "gpu-models"
WHEELS = ROOT / ".whl"
# What the device image lacks for the backend (its package list: /work/.library/device).
DEVICE_WHEELS = ("orjson==3.13.0", "protobuf==6.33.6")
DEVICE_PYTHON = "3.12"


def upcast(model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp16 graph with fp32 weights, casts and value types (same nodes, same signature)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            wide = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32),
                                           tensor.name)
            graph.initializer[i].CopyFrom(wide)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
    for info in [*graph.value_info, *graph.input, *graph.output]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
    return out


def prepare(models_dir: Path, *, wheels: bool = True) -> Path:
    """Copies the fp16 variant (config, tokenizer, graph) to ``CARRY_MODELS`` and downloads the
    missing wheels for the device's Python into ``WHEELS``; returns the model folder."""
    source = models_dir / "minilm"
    config = orjson.loads((source / "config.json").read_bytes())
    target = CARRY_MODELS / "minilm"
    target.mkdir(parents=True, exist_ok=True)
    fp16 = config["variants"]["fp16"]
    shutil.copyfile(source / fp16, target / fp16)
    shutil.copyfile(source / config["tokenizer"], target / config["tokenizer"])
    config["variants"] = {"fp16": fp16}
    config["default_variant"] = "fp16"
    (target / "config.json").write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
    if wheels:
        WHEELS.mkdir(exist_ok=True)
        platforms = [f"--platform={p}" for p in (
            "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", f"--python-version={DEVICE_PYTHON}",
                        "--implementation=cp", *platforms, "-d", str(WHEELS),
                        *DEVICE_WHEELS], check=True)
    return target


def carried_bytes() -> int:
    """Bytes ``prepare`` left to carry (the device limit is 64 MiB with the working tree)."""
    return sum(p.stat().st_size for folder in (CARRY_MODELS, WHEELS) if folder.exists()
               for p in folder.rglob("*") if p.is_file())
