"""ONNX Runtime sessions: device choice, GPU fallback, variants, and the model repository."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from backend.model import EmbeddingModel, load_models
from backend.repository import RepositoryError, load_config, load_repository
from backend.runtime import DeviceUnavailable, create_runtime, probe_gpu
from backend.settings import ServeSettings, SettingsError

pytestmark = pytest.mark.model

NO_GPU = probe_gpu()
needs_no_gpu = pytest.mark.skipif(NO_GPU is None, reason="a GPU works here")


@pytest.fixture(scope="module")
def config_dir(models_dir: Path) -> Path:
    return models_dir / "minilm"


def test_cpu_session_gives_normalised_embeddings(config_dir: Path) -> None:
    config = load_config(config_dir)
    runtime = create_runtime(config, device="cpu", threads=1)
    assert (runtime.device, runtime.variant, runtime.provider) == (
        "cpu", "fp32", "CPUExecutionProvider")
    ids = np.array([[101, 7592, 102, 0], [101, 7592, 2088, 102]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    out = runtime.run(ids, mask)
    assert out.shape == (2, 384) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-4)


def test_int8_variant_agrees_with_fp32(config_dir: Path) -> None:
    config = load_config(config_dir)
    fp32 = create_runtime(config, device="cpu", threads=1)
    int8 = create_runtime(config, device="cpu", threads=1, variant="int8")
    assert int8.variant == "int8"
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    mask = np.ones_like(ids)
    assert float((fp32.run(ids, mask) * int8.run(ids, mask)).sum()) >= 0.97


@needs_no_gpu
def test_auto_falls_back_to_cpu_with_one_clear_log_line(
    config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="backend.runtime"):
        runtime = create_runtime(load_config(config_dir), device="auto", threads=1)
    assert (runtime.device, runtime.variant) == ("cpu", "fp32")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    fields: Any = warnings[0].__dict__["fields"]
    assert warnings[0].getMessage() == "no working GPU, serving on the CPU"
    assert fields["reason"] and fields["provider"] == "CPUExecutionProvider"


@needs_no_gpu
def test_device_cuda_without_a_gpu_says_why(config_dir: Path) -> None:
    with pytest.raises(DeviceUnavailable, match=r"--device cuda: no working GPU: .+"):
        create_runtime(load_config(config_dir), device="cuda", threads=1)


def test_unknown_variant_is_refused(config_dir: Path) -> None:
    with pytest.raises(RepositoryError, match="no 'bf16' variant"):
        create_runtime(load_config(config_dir), device="cpu", variant="bf16")


def test_load_models_honours_settings(models_dir: Path) -> None:
    (model,) = load_models(ServeSettings(models_dir=models_dir, device="cpu", threads=1,
                                         variant="int8"))
    assert isinstance(model, EmbeddingModel)
    assert model.runtime.variant == "int8"
    seqs = model.tokenize(["short", "a bit longer text"])
    rows = model.compute(seqs)
    assert len(rows) == 2 and rows[0].shape == (384,)
    assert model.warm_up([8, 300], [1, 2]) > 0


def broken_copy(tmp_path: Path, config_dir: Path, **changes: Any) -> Path:
    target = tmp_path / "minilm"
    target.mkdir()
    shutil.copy(config_dir / "tokenizer.json", target / "tokenizer.json")
    raw = orjson.loads((config_dir / "config.json").read_bytes())
    for key, value in changes.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    (target / "config.json").write_bytes(orjson.dumps(raw))
    return target


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_batch_size": 0}, "'max_batch_size' must be an integer >= 1"),
        ({"version": None}, "field 'version' is missing"),
        ({"name": "other"}, "must match its folder"),
        ({"default_variant": "bf16"}, "default_variant 'bf16' is not in variants"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}]}, "one BYTES tensor"),
        ({"tokenizer": "missing.json"}, "tokenizer file"),
    ],
)
def test_invalid_config_names_file_and_field(
    tmp_path: Path, config_dir: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(RepositoryError, match=message) as info:
        load_config(broken_copy(tmp_path, config_dir, **changes))
    assert "config.json" in str(info.value)


def test_empty_or_missing_repository_says_how_to_build(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "absent"):
        with pytest.raises(RepositoryError, match="build-model"):
            load_repository(folder)


def test_missing_variant_file_is_refused(tmp_path: Path, config_dir: Path) -> None:
    config = load_config(broken_copy(tmp_path, config_dir))
    with pytest.raises(RepositoryError, match=r"file .* is missing"):
        config.variant_path("fp32")


def test_settings_validate_and_read_the_environment() -> None:
    with pytest.raises(SettingsError, match="threads"):
        ServeSettings(threads=0)
    with pytest.raises(SettingsError, match="device"):
        ServeSettings(device="tpu")  # type: ignore[arg-type]
    settings = ServeSettings.from_env(
        {"BACKEND_PORT": "9000", "BACKEND_WARMUP_LENGTHS": "8,16", "BACKEND_ACCESS_LOG": "no",
         "BACKEND_MAX_QUEUE_DELAY_MS": "1.5"},
        port=None, zone="z1",
    )
    assert (settings.port, settings.warmup_lengths, settings.access_log) == (9000, (8, 16), False)
    assert (settings.max_queue_delay_ms, settings.zone) == (1.5, "z1")
    with pytest.raises(SettingsError, match="BACKEND_PORT"):
        ServeSettings.from_env({"BACKEND_PORT": "eighty"})
