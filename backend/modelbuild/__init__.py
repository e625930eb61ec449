"""Model build: all-MiniLM-L6-v2 safetensors -> ONNX model repository, without PyTorch.

``build_model`` writes ``models/<name>/`` (config.json, tokenizer.json, model.onnx,
model.int8.onnx, model.fp16.onnx) as docs/ARCHITECTURE.md describes; ``cli.register`` adds the
``build-model`` subcommand to ``python -m backend``. Every failure is a ``ModelBuildError``.
"""

from backend.modelbuild.build import build_model
from backend.modelbuild.errors import ModelBuildError

__all__ = ["ModelBuildError", "build_model"]
