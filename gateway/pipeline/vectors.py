"""How a text's embedding is kept as an item value: float32 bytes, token count in ``meta``."""

from __future__ import annotations

import struct

import numpy as np

from gateway.pipeline.call import Fetched, Outcome

_TOKENS = struct.Struct("<I")


def pack(vec: np.ndarray, tokens: int, compute_ms: float) -> Fetched:
    """An item value from one row of a backend answer."""
    return Fetched(np.ascontiguousarray(vec, dtype=np.float32).tobytes(), _TOKENS.pack(tokens),
                   compute_ms)


def vector(item: Outcome) -> np.ndarray:
    """The embedding (read-only float32, no copy)."""
    return np.frombuffer(item.value, dtype=np.float32)


def tokens(item: Outcome) -> int:
    """The token count stored beside the embedding (0 when the backend did not report it)."""
    return meta_tokens(item.meta)


def meta_tokens(meta: bytes) -> int:
    """The token count an item's ``meta`` holds (0: none reported, or not a text's item)."""
    return _TOKENS.unpack(meta)[0] if len(meta) == _TOKENS.size else 0
