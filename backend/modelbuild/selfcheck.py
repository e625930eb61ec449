"""A last check before a built model is published: every variant runs and agrees with the
plain graph.

The fused and converted variants come out of ONNX Runtime's pattern-matching tools; a pattern
that matched wrongly would give a model that loads and serves confident nonsense. So each
variant embeds a small padded batch on the CPU and must point the same way as the unfused
fp32 graph built straight from the weights.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

from backend.modelbuild.bert_graph import ATTENTION_MASK, INPUT_IDS
from backend.modelbuild.errors import ModelBuildError
from backend.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

# Two lengths in one batch, so padding and the attention mask are exercised too.
_PROBE = (
    "A quick self-check sentence.",
    "The model repository is published only after every variant has embedded this batch "
    "and agreed with the plain float32 graph built straight from the weights.",
)
MIN_COSINE = {"fp32": 0.9999, "fp16": 0.999, "int8": 0.95}


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the build's own messages say what matters
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _embed(session: ort.InferenceSession,
           feeds: Mapping[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
    out: npt.NDArray[np.float32] = session.run(None, dict(feeds))[0]
    return out


def check_variants(reference: onnx.ModelProto, files: Mapping[str, Path],
                   tokenizer: TextTokenizer) -> None:
    """Raises ``ModelBuildError`` when a variant disagrees with ``reference``.

    An fp16 model that the CPU provider cannot run is only logged: it is meant for the GPU.
    """
    input_ids, attention_mask = tokenizer.encode(_PROBE)
    feeds = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
    expected = _embed(_session(reference), feeds)
    for variant, path in files.items():
        try:
            got = _embed(_session(path), feeds)
        except (Fail, OrtNotImplemented) as exc:
            if variant == "fp16":
                logger.warning("fp16 variant not checked: the CPU provider cannot run it (%s)",
                               str(exc).splitlines()[0])
                continue
            raise ModelBuildError(f"the {variant} variant does not run: {exc}") from exc
        if got.shape != expected.shape or not np.all(np.isfinite(got)):
            raise ModelBuildError(f"the {variant} variant returned shape {got.shape} "
                                  f"or non-finite values; expected {expected.shape}")
        norms = np.linalg.norm(got, axis=1)
        if np.any(np.abs(norms - 1.0) > 1e-2):
            raise ModelBuildError(f"the {variant} variant is not L2-normalised (norms {norms})")
        cosine = float(np.min(np.sum(got * expected, axis=1) / norms))
        if cosine < MIN_COSINE[variant]:
            raise ModelBuildError(f"the {variant} variant disagrees with the plain graph "
                                  f"(cosine {cosine:.5f} < {MIN_COSINE[variant]})")
        logger.info("%s variant checked: cosine %.6f to the plain graph", variant, cosine)
