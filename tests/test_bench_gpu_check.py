"""bench/gpu_check.sh on this machine (no GPU): every section ran or says why it was skipped;
and the fp32 graph it builds from the carried fp16 one is the model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bench.gpu_carry import upcast
from bench.gpu_sections import cosines, sections
from tests.conftest import REPO


@pytest.mark.model
def test_the_fp32_graph_built_from_fp16_is_the_model(models_dir: Path,
                                                     reference: dict[str, Any]) -> None:
    fp16 = onnx.load(str(models_dir / "minilm" / "model.fp16.onnx"))
    wide = upcast(fp16)
    kinds = {t.data_type for t in wide.graph.initializer}
    assert onnx.TensorProto.FLOAT16 not in kinds
    assert [n.op_type for n in wide.graph.node] == [n.op_type for n in fp16.graph.node]
    from backend.model import EmbeddingModel
    from backend.repository import load_repository
    from backend.runtime import ModelRuntime
    from backend.tokenizer import TextTokenizer

    (config,) = load_repository(models_dir)
    session = ort.InferenceSession(wide.SerializeToString(), providers=["CPUExecutionProvider"])
    model = EmbeddingModel(config, TextTokenizer.from_file(config.tokenizer_path,
                                                           max_length=config.max_seq_length),
                           ModelRuntime(session, config, "fp32"))
    items = reference["items"]
    rows = np.stack([row for row, _ in model.embed([i["text"] for i in items])])
    # fp16-rounded weights computed in fp32: the model still (the fp32 build gives >= 0.9999).
    assert cosines(rows, [i["embedding"] for i in items]).min() >= 0.999


@pytest.mark.model
def test_gpu_check_runs_here_and_says_what_it_skipped(models_dir: Path) -> None:
    env = {**os.environ, "PY": str(REPO / ".venv" / "bin" / "python"), "BUDGET_S": "240"}
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--quick", "--models", str(models_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.split("### summary", 1)[1].strip().splitlines()
    names = [name for name, _ in sections()]
    assert len(summary) == len(names)
    outcome = {}
    for name, line in zip(names, summary, strict=True):
        assert line.startswith(f"- {name}: "), (name, line)
        outcome[name] = line[len(f"- {name}: "):]
    for name, said in outcome.items():
        assert said == "ran" or (said.startswith("skipped: ") and len(said) > 15), (name, said)
    assert outcome["fp32 graph built from the carried fp16 one"] == "ran"
    assert outcome["backend cold start and /metrics"] == "ran"
    if "CUDAExecutionProvider" not in ort.get_available_providers() or outcome[
            "CUDA EP, fp16 graph"] != "ran":  # this machine: no GPU, so the GPU parts say why
        assert outcome["latency: GPU fp16 vs CPU fp32"].startswith("skipped: no CUDA session")
    assert '"first_100":{"answers":20' in done.stdout  # the backend's cold-start figures
