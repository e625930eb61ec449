"""What a route hands the pipeline, a ``Call`` (the adapter at the edge), and what it gets back.

A route differs from the others only in how it parses a body, what the canonical form of each
cacheable unit is, how it asks a backend for the units it lacks, and how it renders the answer.
Those four things are a ``Call``; everything else (policy, keys, cache tiers, coalescing,
admission, routing, stores, staleness) is the one pipeline in ``core.py``.

A cacheable unit is an ``Item``: for ``/v1/embeddings``, ``/v1/classify`` and ``/v1/rank`` one per
text (each text is cached on its own); for ``/v2/models/{name}/infer`` one per request (the
whole canonical request). Item values are opaque bytes to the pipeline and the tiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.cache.entry import Entry
    from gateway.cache.keys import CacheKey
    from gateway.pipeline.context import RequestContext
    from gateway.policy import Decision
    from gateway.upstream import Upstream

# Item cache results, also the X-Cache vocabulary.
HIT, MISS, STALE, COALESCED, BYPASS = "HIT", "MISS", "STALE", "COALESCED", "BYPASS"

Groups = Sequence[tuple[str, Sequence[str]]]


@dataclass(frozen=True, slots=True)
class Item:
    """One cacheable unit: its canonical bytes (what the key hashes) and whether the policy lets
    it be cached. An item that may not be stored is not read from a cache either."""

    canonical: bytes
    store: bool


@dataclass(frozen=True, slots=True)
class Fetched:
    """One item's answer from a backend, shared with coalesced followers (do not mutate)."""

    value: bytes
    meta: bytes
    compute_ms: float


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A backend call's answers (one per item asked, in order) and the timing it reported."""

    items: list[Fetched]
    queue_ms: float = 0.0
    compute_ms: float = 0.0


@dataclass(slots=True)
class Outcome:
    """One item's answer and how it was obtained."""

    value: bytes
    meta: bytes
    status: str
    age_s: float
    key: CacheKey | None = None
    entry: Entry | None = None
    """The cache entry it came from (hits): lets a renderer reuse what it made of it before."""


@dataclass(slots=True)
class Result:
    """Every item of a request, in request order, and the decision that governed them."""

    outcomes: list[Outcome]
    decision: Decision
    cache_status: str
    age_s: float


class Call(Protocol):
    """One parsed, validated request of some route: the adapter the pipeline runs."""

    @property
    def model(self) -> str:
        """The backend model name."""
        ...

    def groups(self) -> Groups:
        """The request's texts by field, for the policy (``input``, ``labels``...)."""
        ...

    def items(self, decision: Decision) -> list[Item]:
        """The cacheable units, built from the policy's (normalised, redacted) texts."""
        ...

    async def fetch(
        self, upstream: Upstream, ctx: RequestContext, decision: Decision, indexes: Sequence[int]
    ) -> FetchResult:
        """Ask a backend for the items at ``indexes`` (of ``items(decision)``), in order."""
        ...

    def render(self, result: Result) -> bytes:
        """The response body."""
        ...
