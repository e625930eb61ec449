"""The ``build-model`` subcommand: ``python -m backend build-model minilm --out models``.

``register`` adds the subcommand to the backend's argparse tree; the parsed namespace carries
``func``, a function from the namespace to an exit code (0 built or already built, 1 failed
with a message on stderr).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from backend.modelbuild.build import build_model
from backend.modelbuild.errors import ModelBuildError
from backend.modelbuild.variants import VARIANTS
from backend.modelbuild.weights import KNOWN_MODELS


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds ``build-model`` to ``subparsers``; its namespace's ``func`` runs it."""
    parser = subparsers.add_parser(
        "build-model",
        help="convert a model's weights to ONNX and write its model repository folder",
        description="Build models/<name>/ (config.json, tokenizer.json, ONNX variants) from the "
        "weights package, without PyTorch. An existing complete build is kept unless --force.",
    )
    parser.add_argument("name", choices=sorted(KNOWN_MODELS), help="model to build")
    parser.add_argument("--out", type=Path, default=Path("models"),
                        help="model repository folder (default: models)")
    parser.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even when the model folder already exists")
    parser.set_defaults(func=run)


def _variant_list(text: str) -> list[str]:
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(VARIANTS)}, got {text!r}")
    return wanted


def run(args: argparse.Namespace) -> int:
    """Builds the model the namespace names; returns the process exit code."""
    # INFO from the build (steps, self-check results) is the command's progress output.
    logging.getLogger("backend.modelbuild").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s", stream=sys.stderr)
    started = time.perf_counter()
    try:
        folder = build_model(args.name, args.out, args.variants, args.force)
    except ModelBuildError as exc:
        print(f"build-model: error: {exc}", file=sys.stderr)
        return 1
    print(f"{folder} ready ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 0
