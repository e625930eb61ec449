"""Text to token ids for the BERT-family models, with dynamic padding.

The ``tokenizer.json`` shipped with all-MiniLM-L6-v2 carries its own truncation (128 tokens)
and fixed padding (to 128). Both are wrong for this service: the model's ``max_seq_length`` is
256, and padding every batch to a fixed width wastes compute on short texts. This wrapper turns
the file's own handling off, truncates to ``max_length`` itself (special tokens included, as
sentence-transformers does) and pads each batch to its longest member only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

IdArray = npt.NDArray[np.int64]

# Characters per WordPiece token in English prose (MiniLM's vocabulary): ~5.3 on a paragraph of
# the latency benchmark, ~3-4 on short sentences once [CLS] and [SEP] count. Only the order of
# estimates matters much: the batcher sorts by them.
_CHARS_PER_TOKEN = 5

# [CLS] + [SEP]: anything shorter cannot hold a single text.
_MIN_LENGTH = 2


class TextTokenizer:
    """Tokenizes texts into int64 ids (``[CLS] ... [SEP]``) and pads batches dynamically.

    ``tokenize`` and ``pad`` are separate so that a batcher can tokenize requests as they
    arrive, group them by length, and pad only when it forms a batch.
    """

    def __init__(self, tokenizer: Tokenizer, *, max_length: int = 256, pad_id: int = 0) -> None:
        if max_length < _MIN_LENGTH:
            raise ValueError(f"max_length must be at least {_MIN_LENGTH}, got {max_length}")
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.pad_id = pad_id

    @classmethod
    def from_file(cls, path: Path, max_length: int = 256) -> TextTokenizer:
        """Loads a ``tokenizer.json``; its own padding and truncation settings are replaced."""
        tokenizer = Tokenizer.from_file(str(path))
        pad_id = tokenizer.token_to_id("[PAD]")
        return cls(tokenizer, max_length=max_length, pad_id=0 if pad_id is None else pad_id)

    def tokenize(self, texts: Sequence[str]) -> list[IdArray]:
        """One int64 id array per text, special tokens included, at most ``max_length`` long."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    def estimate_length(self, text: str) -> int:
        """About how many ids ``tokenize`` would give ``text`` (special tokens included,
        capped at ``max_length``), from its length alone: the batcher groups texts by length
        before they are tokenized, in the worker thread."""
        return min(self.max_length, len(text) // _CHARS_PER_TOKEN + 2)

    def pad(self, seqs: Sequence[IdArray]) -> tuple[IdArray, IdArray]:
        """Right-pads to the longest sequence: ``(input_ids, attention_mask)``, int64 [B, L]."""
        longest = max((len(seq) for seq in seqs), default=0)
        input_ids = np.full((len(seqs), longest), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(seqs), longest), dtype=np.int64)
        for row, seq in enumerate(seqs):
            input_ids[row, : len(seq)] = seq
            attention_mask[row, : len(seq)] = 1
        return input_ids, attention_mask

    def encode(self, texts: Sequence[str]) -> tuple[IdArray, IdArray]:
        """``pad(tokenize(texts))``: model-ready ``(input_ids, attention_mask)``."""
        return self.pad(self.tokenize(texts))
