"""Per-tenant accounting: what one request used (the label it is counted under: labels.py).

Per request (``TenantUsage``): texts by where their answer came from (a backend, a cache, an
identical call in flight), tokens (as the backend counted them; stored beside each cached
embedding, so a hit reports the tokens it would have cost), the backend compute time the request
caused (the backends' own ``compute`` timing of the calls it led) and the compute time its cache
answers saved (the compute time stored with each entry).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.cache.entry import Entry
from gateway.pipeline.call import BYPASS, COALESCED, HIT, MISS, STALE, Outcome
from gateway.pipeline.vectors import meta_tokens as _tokens
from gateway.telemetry.usage import TenantUsage


def usage_of(outcomes: Sequence[Outcome], compute_ms: float) -> TenantUsage:
    """A full-path request's usage; ``compute_ms``: the backend compute its calls reported."""
    backend = cached = coalesced = tokens = 0
    saved_ms = 0.0
    for o in outcomes:
        tokens += _tokens(o.meta)
        if o.status in (HIT, STALE):
            cached += 1
            if o.entry is not None:
                saved_ms += o.entry.compute_ms
        elif o.status == COALESCED:
            coalesced += 1
        elif o.status in (MISS, BYPASS):
            backend += 1
    return TenantUsage(backend, cached, coalesced, tokens, compute_ms / 1000.0,
                       saved_ms / 1000.0)


def hot_usage(entries: Iterable[Entry]) -> TenantUsage:
    """A hot answer's usage (gateway/pipeline/hot_answers.py): every item an L1 hit."""
    n = tokens = 0
    saved_ms = 0.0
    for entry in entries:
        n += 1
        tokens += _tokens(entry.meta)
        saved_ms += entry.compute_ms
    return TenantUsage(cached_texts=n, tokens=tokens, saved_s=saved_ms / 1000.0)
