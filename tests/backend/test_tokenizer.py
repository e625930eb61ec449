"""TextTokenizer: the shipped tokenizer.json's fixed 128 padding/truncation is replaced by
dynamic padding and truncation at the model's 256 tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.modelbuild.weights import MINILM, TOKENIZER, locate
from backend.tokenizer import TextTokenizer

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def tokenizer_path() -> Path:
    return locate(MINILM) / TOKENIZER


@pytest.fixture(scope="module")
def tok(tokenizer_path: Path) -> TextTokenizer:
    return TextTokenizer.from_file(tokenizer_path)


def test_ids_carry_special_tokens(tok: TextTokenizer) -> None:
    [ids] = tok.tokenize(["hello world"])
    assert ids.dtype == np.int64
    assert ids[0] == CLS and ids[-1] == SEP
    assert len(ids) == 4
    [empty] = tok.tokenize([""])
    assert empty.tolist() == [CLS, SEP]


def test_batch_is_padded_to_its_longest_not_to_128(tok: TextTokenizer) -> None:
    texts = ["hi", "a somewhat longer sentence than the first one", "mid length"]
    lengths = [len(ids) for ids in tok.tokenize(texts)]
    input_ids, attention_mask = tok.encode(texts)
    assert input_ids.shape == attention_mask.shape == (3, max(lengths))
    assert max(lengths) < 128
    assert input_ids.dtype == attention_mask.dtype == np.int64
    assert attention_mask.sum(axis=1).tolist() == lengths
    for row, length in enumerate(lengths):
        assert input_ids[row, length - 1] == SEP
        assert np.all(input_ids[row, length:] == tok.pad_id)


def test_truncates_at_256_not_at_the_files_128(tok: TextTokenizer) -> None:
    medium = " ".join(["word"] * 200)  # 202 tokens: the file's own setting would cut at 128
    long = " ".join(["word"] * 1000)
    [medium_ids, long_ids] = tok.tokenize([medium, long])
    assert len(medium_ids) == 202
    assert len(long_ids) == 256
    assert long_ids[0] == CLS and long_ids[-1] == SEP
    input_ids, attention_mask = tok.encode([long, "short"])
    assert input_ids.shape == (2, 256)
    assert attention_mask[1].sum() == 3


def test_max_length_is_configurable(tokenizer_path: Path) -> None:
    tok = TextTokenizer.from_file(tokenizer_path, max_length=16)
    [ids] = tok.tokenize([" ".join(["word"] * 100)])
    assert len(ids) == 16 and ids[-1] == SEP
    with pytest.raises(ValueError, match="max_length"):
        TextTokenizer.from_file(tokenizer_path, max_length=1)


def test_empty_batch_and_encode_equals_pad_of_tokenize(tok: TextTokenizer) -> None:
    input_ids, attention_mask = tok.encode([])
    assert input_ids.shape == attention_mask.shape == (0, 0)
    texts = ["one", "two three four"]
    for a, b in zip(tok.encode(texts), tok.pad(tok.tokenize(texts)), strict=True):
        np.testing.assert_array_equal(a, b)
