"""What a route hands the pipeline, a ``Call`` (the adapter at the edge), and what it gets back.

A route differs from the others only in how it parses a body, which of two kinds its cacheable
units are (``units.py``) and how it renders the answer. Those are a ``Call``; everything else
(policy, units and keys, cache tiers, coalescing, admission, fetching, stores, staleness) is the
one pipeline (``core.py``), whose stages the one request path calls in order
(``gateway/http/serve.py``).

A cacheable unit is an ``Item``: for ``/v1/embeddings``, ``/v1/classify`` and ``/v1/rank`` one per
text (each text is cached on its own); for ``/v2/models/{name}/infer`` one per request (the
whole canonical request). Item values are opaque bytes to the pipeline and the tiers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.cache.entry import Entry
    from gateway.cache.keys import CacheKey
    from gateway.policy import Decision

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


@dataclass(frozen=True, slots=True)
class PerText:
    """Each text is one item (``units.py``)."""


PER_TEXT = PerText()


@dataclass(frozen=True, slots=True, kw_only=True)
class PerRequest:
    """The whole request is one item (``units.py``)."""

    template: Mapping[str, Any]
    """The OIP request as the backend gets it, less its inputs' ``data``: no ``id``, no binary
    output and no scheduling parameters (the gateway answers JSON and sets those per call)."""
    sizes: tuple[int, ...]
    """How many texts each input takes, in order (the product of its shape)."""
    client_priority: int = 0
    """The client's own ``priority`` parameter (it may only lower the backend priority)."""
    client_timeout_s: float | None = None
    """The client's own ``timeout`` parameter (it may only shorten the deadline)."""

    def outgoing(self, texts: Sequence[str]) -> dict[str, Any]:
        """The request as the backend gets it, with ``texts`` (row-major) as its BYTES data."""
        inputs = []
        start = 0
        for tensor, n in zip(self.template["inputs"], self.sizes, strict=True):
            inputs.append({**tensor, "data": list(texts[start:start + n])})
            start += n
        return {**self.template, "inputs": inputs}


Unit = PerText | PerRequest


class Call(Protocol):
    """One parsed, validated request of some route, as the route's adapter hands it over.

    The adapter is entered twice per request: to parse (which builds this) and to ``render``.
    Between the two the pipeline reads only data: the model, the texts by field for the policy,
    and what the request's cacheable units are (``gateway/pipeline/units.py``)."""

    @property
    def model(self) -> str:
        """The backend model name."""
        ...

    @property
    def groups(self) -> Groups:
        """The request's texts by field, for the policy (``input``, ``labels``...)."""
        ...

    @property
    def unit(self) -> Unit:
        """What one cacheable item is: a text (``PER_TEXT``) or the whole request."""
        ...

    def render(self, result: Result) -> bytes:
        """The response body."""
        ...
