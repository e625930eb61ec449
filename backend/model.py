"""A served embedding model: its config, tokenizer and ONNX Runtime session, loaded together.

``embed`` is what the batcher calls in its worker thread: texts in, one embedding row and
token count per text out. Tokenizing there, not on the event loop, keeps the loop to parsing
and answering, and costs no extra hop (the batch goes to that thread anyway). Loading is
blocking (graph optimisation, session creation), so ``load_models`` is meant to run in an
executor or before the event loop starts.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from backend.repository import ModelConfig, load_repository
from backend.runtime import ModelRuntime, create_runtime
from backend.settings import ServeSettings
from backend.tokenizer import IdArray, TextTokenizer

Embedding = npt.NDArray[np.float32]
# A text's embedding row and the tokens it used (after truncation).
Embedded = tuple[Embedding, int]

log = logging.getLogger("backend.model")


class EmbeddingModel:
    """Texts to L2-normalised sentence embeddings with one model variant."""

    def __init__(
        self, config: ModelConfig, tokenizer: TextTokenizer, runtime: ModelRuntime,
        *, identity: str = "",
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.runtime = runtime
        self.identity = identity
        """SHA-256 (hex) of the ONNX graph served: the weights' identity beside name and
        version (reported in the model metadata's ``parameters.model_sha256``)."""
        # Seconds load_models took for this model (tokenizer and session); None when built
        # by hand.
        self.load_s: float | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def tokenize(self, texts: Sequence[str]) -> list[IdArray]:
        """Token ids per text (special tokens included, truncated to the model's max length)."""
        return self.tokenizer.tokenize(texts)

    def compute(self, seqs: list[IdArray]) -> list[Embedding]:
        """One embedding row per token sequence; pads to the longest in ``seqs`` only."""
        input_ids, attention_mask = self.tokenizer.pad(seqs)
        return list(self.runtime.run(input_ids, attention_mask))

    def embed(self, texts: list[str]) -> list[Embedded]:
        """Tokenize, pad and run one batch: per text its embedding row and token count."""
        seqs = self.tokenize(texts)
        return list(zip(self.compute(seqs), [len(seq) for seq in seqs], strict=True))

    def size_of(self, text: str) -> int:
        """A text's token count, estimated without tokenizing (for grouping by length)."""
        return self.tokenizer.estimate_length(text)

    def warm_up(self, lengths: Sequence[int], batch_sizes: Sequence[int],
                on_call: Callable[[int, float], None] | None = None) -> float:
        """Runs every (length, batch size) pair once so that ONNX Runtime has allocated its
        arenas and picked its kernels before real traffic; returns the seconds it took.
        ``on_call(tokens, seconds)`` hears each call's cost (the scheduler's first estimate)."""
        started = time.perf_counter()
        cls_sep = self.tokenizer.tokenize([""])[0]
        filler = self.tokenizer.tokenize(["hello"])[0][1:-1]
        for length in sorted({min(n, self.config.max_seq_length) for n in lengths}):
            body = np.resize(filler, length - len(cls_sep)).astype(np.int64)
            ids = np.concatenate([cls_sep[:1], body, cls_sep[1:]])
            for batch in sorted(set(batch_sizes)):
                call_started = time.perf_counter()
                rows = self.compute([ids] * batch)
                if on_call is not None:
                    on_call(length * batch, time.perf_counter() - call_started)
                if len(rows) != batch or rows[0].shape != (self.config.dim,):
                    raise RuntimeError(
                        f"model {self.name!r}: warm-up gave {len(rows)} rows of "
                        f"{rows[0].shape}, expected {batch} of ({self.config.dim},)"
                    )
        return time.perf_counter() - started


def load_models(settings: ServeSettings) -> list[EmbeddingModel]:
    """Every model in ``settings.models_dir`` on the configured device (blocking)."""
    models = []
    for config in load_repository(settings.models_dir):
        started = time.perf_counter()
        tokenizer = TextTokenizer.from_file(config.tokenizer_path, max_length=config.max_seq_length)
        runtime = create_runtime(
            config,
            device=settings.device,
            threads=settings.intra_op_threads,
            variant=settings.variant,
            max_batch_size=settings.max_batch_size,
        )
        identity = file_sha256(config.variant_path(runtime.variant))
        model = EmbeddingModel(config, tokenizer, runtime, identity=identity)
        model.load_s = time.perf_counter() - started
        models.append(model)
    return models


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file, read in chunks (a graph is tens of MB; about 0.1 s)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
