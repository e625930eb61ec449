"""The OpenVINO execution provider (backend/openvino.py).

onnxruntime-openvino replaces onnxruntime, so it runs in its own environment, ``.venv-openvino``
(``make openvino``; ``.ci/run`` builds it, so under CI these tests must run, never skip). The
OpenVINO side runs there as a child process; its embeddings of the reference texts must equal
the CPU EP's from this environment (cosine >= 0.9999, inference precision f32)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend import openvino
from backend.model import EmbeddingModel
from backend.repository import load_repository
from backend.runtime import DeviceUnavailable, create_runtime
from bench import openvino_env

ROOT = Path(__file__).resolve().parents[2]

# Runs in .venv-openvino from the repository root: the reference texts in, JSON out.
CHILD = """
import json, logging, sys
from pathlib import Path
from backend.model import load_models
from backend.settings import ServeSettings

class Keep(logging.Handler):
    records = []
    def emit(self, record):
        self.records.append(record)

logging.getLogger("backend.runtime").addHandler(Keep())
logging.getLogger("backend.runtime").setLevel(logging.INFO)
texts = json.loads(sys.stdin.read())
models_dir = Path(sys.argv[1])
(model,) = load_models(ServeSettings(models_dir=models_dir, device="openvino", threads=1))
rows = [row.tolist() for row, _ in model.embed(texts)]
(auto,) = load_models(ServeSettings(models_dir=models_dir, device="auto", threads=1))
probe = [getattr(r, "fields", {}) for r in Keep.records
         if r.getMessage().startswith("auto: the faster CPU provider")]
print(json.dumps({"provider": model.runtime.provider, "rows": rows,
                  "auto_provider": auto.runtime.provider, "probe": probe}))
"""


@pytest.fixture(scope="module")
def openvino_python() -> Path:
    if openvino_env.is_current():
        return openvino_env.python()
    why = ("no current .venv-openvino: `make openvino` builds it (onnxruntime-openvino "
           "replaces onnxruntime, so it lives in its own environment)")
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must build it (.ci/run)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def openvino_run(openvino_python: Path, models_dir: Path, reference: dict[str, Any]
                 ) -> dict[str, Any]:
    texts = [item["text"] for item in reference["items"]]
    done = subprocess.run(
        [str(openvino_python), "-c", CHILD, str(models_dir)], input=json.dumps(texts),
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def cpu_rows(models: list[EmbeddingModel], reference: dict[str, Any]) -> Any:
    assert models[0].runtime.provider == "CPUExecutionProvider"
    texts = [item["text"] for item in reference["items"]]
    return np.stack([row for row, _ in models[0].embed(texts)])


@pytest.mark.model
def test_openvino_embeddings_equal_the_cpu_eps(
        openvino_run: dict[str, Any], cpu_rows: Any, reference: dict[str, Any]) -> None:
    assert openvino_run["provider"] == "OpenVINOExecutionProvider"
    ov = np.asarray(openvino_run["rows"], dtype=np.float32)
    assert ov.shape == cpu_rows.shape == (len(reference["items"]), 384)
    cosines = np.sum(ov * cpu_rows, axis=1) / (
        np.linalg.norm(ov, axis=1) * np.linalg.norm(cpu_rows, axis=1))
    assert cosines.min() >= 0.9999, cosines
    # And both stay the reference model (sentence-transformers' own embeddings).
    expected = np.asarray([item["embedding"] for item in reference["items"]])
    assert float(np.min(np.sum(ov * expected, axis=1))) >= 0.9999


def test_openvino_is_told_f32() -> None:
    options = openvino.provider_options(2)
    assert options["precision"] == "FP32" and options["device_type"] == "CPU"
    assert json.loads(options["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}


@pytest.mark.model
def test_openvino_runs_at_f32(openvino_run: dict[str, Any], cpu_rows: Any) -> None:
    """ORT does not echo OpenVINO's options back, so the precision shows in the numbers: on
    this CPU (avx512_bf16) a bf16 run differs from the CPU EP by 1.1e-3 at most in a vector
    component (measured: cosine 0.99997, which the cosine bound alone would let through);
    f32 by 2e-7."""
    ov = np.asarray(openvino_run["rows"], dtype=np.float32)
    assert float(np.abs(ov - cpu_rows).max()) < 1e-5


@pytest.mark.model
def test_auto_takes_the_faster_provider_on_its_own_probe(openvino_run: dict[str, Any]) -> None:
    (probe,) = openvino_run["probe"]
    times = probe["probe_ms"]
    assert set(times) == {"CPUExecutionProvider", "OpenVINOExecutionProvider"}
    fastest = min(times, key=times.__getitem__)
    assert probe["chosen"] == fastest == openvino_run["auto_provider"]


@pytest.mark.model
def test_device_openvino_without_it_says_how_to_get_it(models_dir: Path) -> None:
    """In this environment (onnxruntime-gpu, no OpenVINO EP) --device openvino is refused."""
    (config,) = load_repository(models_dir)
    with pytest.raises(DeviceUnavailable, match="make openvino"):
        create_runtime(config, device="openvino", threads=1)
