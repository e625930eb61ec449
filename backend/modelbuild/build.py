"""``build_model``: weights package -> verified ONNX variants -> published model folder.

The steps, each in its own module: locate and hash-check the weights (``weights``), build the
plain fp32 graph (``bert_graph``), derive the variants (``variants``), check them against the
plain graph (``selfcheck``), and publish the folder atomically (``repository``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import onnx

from backend.modelbuild import repository, selfcheck
from backend.modelbuild.bert_graph import build_bert_graph
from backend.modelbuild.errors import ModelBuildError
from backend.modelbuild.variants import FILENAMES, VARIANTS, fuse, quantize_int8, to_float16
from backend.modelbuild.weights import KNOWN_MODELS, load_weights, locate
from backend.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)


def build_model(
    name: str,
    out: Path,
    variants: Sequence[str] = VARIANTS,
    force: bool = False,
    *,
    weights_dir: Path | None = None,
) -> Path:
    """Builds ``out/name`` and returns it; an existing complete build is kept unless ``force``.

    ``weights_dir`` replaces the installed package's folder (its files are hash-checked the
    same way); it exists for offline mirrors and tests.
    """
    package = KNOWN_MODELS.get(name)
    if package is None:
        raise ModelBuildError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    wanted = _check_variants(variants)
    final = out / name
    if not force and final.exists():
        if not (final / repository.CONFIG).is_file():
            raise ModelBuildError(f"{final} exists but is not a built model; pass --force")
        missing = repository.missing_variants(final, wanted)
        if missing:
            raise ModelBuildError(f"{final} lacks variant(s) {', '.join(missing)}; "
                                  "pass --force to rebuild it")
        logger.info("%s is already built; pass --force to rebuild it", final)
        return final

    started = time.perf_counter()
    weights = load_weights(weights_dir or locate(package), package.safetensors_sha256)
    config = weights.config
    plain = build_bert_graph(config, weights.tensors)
    tokenizer = TextTokenizer.from_file(weights.tokenizer_path, max_length=config.max_seq_length)

    with repository.staging(out, name) as stage:
        files = {v: stage / FILENAMES[v] for v in wanted}
        if "fp32" in files or "int8" in files:
            fp32 = fuse(plain, config, skip_layer_norm=False)
            if "fp32" in files:
                _save(fp32, files["fp32"])
            if "int8" in files:
                quantize_int8(fp32, files["int8"])
        if "fp16" in files:
            _save(to_float16(fuse(plain, config, skip_layer_norm=True)), files["fp16"])
        selfcheck.check_variants(plain, files, tokenizer)
        shutil.copyfile(weights.tokenizer_path, stage / repository.TOKENIZER)
        repository.write_config(stage, repository.model_config(
            name=name,
            requirement=package.requirement,
            safetensors_sha256=weights.sha256,
            dim=config.hidden_size,
            max_seq_length=config.max_seq_length,
            variant_files={v: path.name for v, path in files.items()},
        ))
        repository.publish(stage, final, force=force)
    logger.info("built %s (%s) in %.1f s", final, ", ".join(wanted), time.perf_counter() - started)
    return final


def _check_variants(wanted: Sequence[str]) -> list[str]:
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown or not wanted:
        raise ModelBuildError(f"variants must be a non-empty subset of "
                              f"{','.join(VARIANTS)}; got {','.join(wanted) or 'none'}")
    return list(dict.fromkeys(wanted))  # de-duplicated, order kept


def _save(model: onnx.ModelProto, path: Path) -> None:
    try:
        onnx.save(model, str(path))
    except (OSError, ValueError) as exc:
        raise ModelBuildError(f"cannot write {path}: {exc}") from exc

