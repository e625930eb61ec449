"""The model repository: ``models/<name>/config.json`` read and validated into ``ModelConfig``.

The layout and the config's fields are documented in docs/ARCHITECTURE.md. Validation raises
``RepositoryError`` naming the file and the field, so a broken build is caught at startup rather
than at the first request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

CONFIG_FILE = "config.json"


class RepositoryError(Exception):
    """The model repository is missing or a config is invalid; the message names the file."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An OIP tensor description: name, datatype and shape (-1 for variable dimensions)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One model's ``config.json``, validated; paths are absolute."""

    name: str
    version: str
    platform: str
    directory: Path
    dim: int
    max_seq_length: int
    max_batch_size: int
    max_queue_delay_ms: float
    max_queue_size: int
    tokenizer_path: Path
    variants: Mapping[str, Path]
    default_variant: str
    onnx_inputs: tuple[str, str]
    onnx_output: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input(self) -> TensorSpec:
        """The one text input (a BYTES tensor)."""
        return self.inputs[0]

    @property
    def output(self) -> TensorSpec:
        """The one embedding output (an FP32 tensor)."""
        return self.outputs[0]

    def variant_path(self, variant: str) -> Path:
        """The ``.onnx`` file of ``variant``; raises when the build did not write it."""
        path = self.variants.get(variant)
        if path is None:
            raise RepositoryError(
                f"model {self.name!r} has no {variant!r} variant "
                f"(it has: {', '.join(self.variants)})"
            )
        if not path.is_file():
            raise RepositoryError(
                f"model {self.name!r}: variant {variant!r} file {path} is missing"
            )
        return path


def load_repository(models_dir: Path) -> list[ModelConfig]:
    """Every model under ``models_dir`` (one sub-folder with a config.json each), by name."""
    if not models_dir.is_dir():
        raise RepositoryError(
            f"model repository {models_dir} does not exist "
            "(build one: python -m backend build-model minilm --out models)"
        )
    configs = [
        load_config(child)
        for child in sorted(models_dir.iterdir())
        # Dot folders are builds in progress or swapped-out old builds: never serve them.
        if not child.name.startswith(".") and (child / CONFIG_FILE).is_file()
    ]
    if not configs:
        raise RepositoryError(
            f"no models in {models_dir} (build one: python -m backend build-model minilm "
            f"--out {models_dir})"
        )
    return configs


def load_config(directory: Path) -> ModelConfig:
    """Reads and validates ``directory/config.json``."""
    path = directory / CONFIG_FILE
    try:
        raw = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise RepositoryError(f"{path}: cannot read: {exc}") from None
    if not isinstance(raw, dict):
        raise RepositoryError(f"{path}: must hold a JSON object")
    get = _Getter(path, raw)
    name = get.text("name")
    if name != directory.name:
        raise RepositoryError(f"{path}: name {name!r} must match its folder {directory.name!r}")
    variants = get.mapping("variants")
    if not variants or not all(isinstance(v, str) for v in variants.values()):
        raise RepositoryError(f"{path}: variants must map variant names to .onnx file names")
    default_variant = get.text("default_variant")
    if default_variant not in variants:
        raise RepositoryError(f"{path}: default_variant {default_variant!r} is not in variants")
    onnx_inputs = get.array("onnx_inputs")
    if len(onnx_inputs) != 2 or not all(isinstance(i, str) for i in onnx_inputs):
        raise RepositoryError(f"{path}: onnx_inputs must name input_ids and attention_mask")
    inputs = tuple(_tensor(path, "inputs", t) for t in get.array("inputs"))
    outputs = tuple(_tensor(path, "outputs", t) for t in get.array("outputs"))
    if len(inputs) != 1 or inputs[0].datatype != "BYTES":
        raise RepositoryError(f"{path}: inputs must be exactly one BYTES tensor")
    if len(outputs) != 1 or outputs[0].datatype != "FP32":
        raise RepositoryError(f"{path}: outputs must be exactly one FP32 tensor")
    tokenizer_path = directory / get.text("tokenizer")
    if not tokenizer_path.is_file():
        raise RepositoryError(f"{path}: tokenizer file {tokenizer_path} is missing")
    return ModelConfig(
        name=name,
        version=get.text("version"),
        platform=get.text("platform"),
        directory=directory.resolve(),
        dim=get.integer("dim"),
        max_seq_length=get.integer("max_seq_length", minimum=2),
        max_batch_size=get.integer("max_batch_size"),
        max_queue_delay_ms=get.number("max_queue_delay_ms"),
        max_queue_size=get.integer("max_queue_size"),
        tokenizer_path=tokenizer_path.resolve(),
        variants={k: (directory / v).resolve() for k, v in variants.items()},
        default_variant=default_variant,
        onnx_inputs=(onnx_inputs[0], onnx_inputs[1]),
        onnx_output=get.text("onnx_output"),
        inputs=inputs,
        outputs=outputs,
    )


class _Getter:
    """Typed field access that names the file and field in every error."""

    def __init__(self, path: Path, raw: dict[str, Any]) -> None:
        self.path = path
        self.raw = raw

    def _get(self, key: str) -> Any:
        if key not in self.raw:
            raise RepositoryError(f"{self.path}: field {key!r} is missing")
        return self.raw[key]

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or not value:
            raise RepositoryError(f"{self.path}: field {key!r} must be a non-empty string")
        return value

    def integer(self, key: str, *, minimum: int = 1) -> int:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise RepositoryError(f"{self.path}: field {key!r} must be an integer >= {minimum}")
        return value

    def number(self, key: str) -> float:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise RepositoryError(f"{self.path}: field {key!r} must be a number >= 0")
        return float(value)

    def mapping(self, key: str) -> dict[str, Any]:
        value = self._get(key)
        if not isinstance(value, dict):
            raise RepositoryError(f"{self.path}: field {key!r} must be an object")
        return value

    def array(self, key: str) -> list[Any]:
        value = self._get(key)
        if not isinstance(value, list):
            raise RepositoryError(f"{self.path}: field {key!r} must be a list")
        return value


def _tensor(path: Path, field: str, raw: Any) -> TensorSpec:
    ok = (
        isinstance(raw, dict)
        and isinstance(raw.get("name"), str)
        and isinstance(raw.get("datatype"), str)
        and isinstance(raw.get("shape"), list)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in raw["shape"])
    )
    if not ok:
        raise RepositoryError(f"{path}: every entry of {field!r} needs name, datatype and shape")
    return TensorSpec(raw["name"], raw["datatype"], tuple(raw["shape"]))
