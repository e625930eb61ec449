"""How a text's embedding is kept as an item value: float32 bytes, token count in ``meta``."""

from __future__ import annotations

import struct

import numpy as np

from gateway.pipeline import Fetched, Outcome

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
    return _TOKENS.unpack(item.meta)[0] if len(item.meta) == _TOKENS.size else 0
