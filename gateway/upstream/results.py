"""What the upstream client returns: embeddings from a backend (``InferResult``) and a backend's
answer passed through as is (``RawResult``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gateway.upstream.wire import server_timing


@dataclass(frozen=True, slots=True)
class InferResult:
    """Embeddings from one backend call, with where and how long it took."""

    embeddings: np.ndarray  # float32 [n, dim]
    backend: str
    zone: str
    queue_ms: float
    compute_ms: float
    upstream_s: float
    model_version: str
    token_counts: list[int] | None = None  # per text, when the backend reports them


@dataclass(frozen=True, slots=True)
class RawResult:
    """A backend's answer passed through as is."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    backend: str
    zone: str = ""
    upstream_s: float = 0.0

    @property
    def timing_ms(self) -> dict[str, float]:
        """The backend's ``Server-Timing`` (queue, compute...) in milliseconds."""
        return server_timing(self.headers)
