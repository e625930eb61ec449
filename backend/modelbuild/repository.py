"""The model repository folder on disk: its ``config.json`` and its atomic publication.

A model folder is built in a hidden staging folder next to its final place and renamed into
place only when every file is written, so a crashed or interrupted build never leaves a folder
that looks complete (``backend serve`` and the test fixtures treat ``config.json`` as "built").
The ``config.json`` keys are the contract in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from backend.modelbuild.bert_graph import ATTENTION_MASK, INPUT_IDS, OUTPUT
from backend.modelbuild.errors import ModelBuildError

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
VERSION = "1"

# Serving defaults written into every config; `backend serve` reads them from there.
MAX_BATCH_SIZE = 32
MAX_QUEUE_DELAY_MS = 2.0
MAX_QUEUE_SIZE = 1024


def model_config(
    *,
    name: str,
    requirement: str,
    safetensors_sha256: str,
    dim: int,
    max_seq_length: int,
    variant_files: Mapping[str, str],
) -> dict[str, Any]:
    """The ``config.json`` contents for a built model (keys as docs/ARCHITECTURE.md lists)."""
    default = "fp32" if "fp32" in variant_files else next(iter(variant_files))
    return {
        "name": name,
        "version": VERSION,
        "platform": "onnxruntime_onnx",
        "source": {"package": requirement, "safetensors_sha256": safetensors_sha256},
        "dim": dim,
        "max_seq_length": max_seq_length,
        "max_batch_size": MAX_BATCH_SIZE,
        "max_queue_delay_ms": MAX_QUEUE_DELAY_MS,
        "max_queue_size": MAX_QUEUE_SIZE,
        "tokenizer": TOKENIZER,
        "variants": dict(variant_files),
        "default_variant": default,
        "onnx_inputs": [INPUT_IDS, ATTENTION_MASK],
        "onnx_output": OUTPUT,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, dim]}],
    }


def write_config(folder: Path, config: Mapping[str, Any]) -> None:
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def read_config(folder: Path) -> dict[str, Any]:
    """A built model's config; a missing or unreadable one is a ``ModelBuildError``."""
    path = folder / CONFIG
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelBuildError(f"cannot read {path}: {exc}") from exc
    return config


def missing_variants(folder: Path, variants: Sequence[str]) -> list[str]:
    """Which of ``variants`` a built model folder lacks (listed in its config and on disk)."""
    files = read_config(folder).get("variants", {})
    return [v for v in variants if v not in files or not (folder / files[v]).is_file()]


@contextmanager
def staging(out: Path, name: str) -> Iterator[Path]:
    """A fresh hidden folder inside ``out`` to build ``name`` in; removed if not published."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=out))
        # mkdtemp makes it private (0700); a published model must be readable by the server,
        # which may run as another user.
        stage.chmod(0o755)
    except OSError as exc:
        raise ModelBuildError(f"cannot create a build folder in {out}: {exc}") from exc
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(stage: Path, final: Path, *, force: bool) -> None:
    """Moves a fully written ``stage`` to ``final``, replacing it only when ``force``."""
    try:
        if not final.exists():
            try:
                stage.rename(final)
            except OSError:
                # A concurrent build of the same model published first: theirs will do.
                if force or not (final / CONFIG).is_file():
                    raise
            return
        if not force:
            raise ModelBuildError(f"{final} already exists; pass --force to rebuild it")
        # Two renames, not an in-place overwrite: readers see the old model or the new one,
        # never a mix (for an instant, no folder at all).
        old = final.with_name(f".{final.name}.replaced-{os.getpid()}")
        final.rename(old)
        stage.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise ModelBuildError(f"cannot move the built model into {final}: {exc}") from exc
