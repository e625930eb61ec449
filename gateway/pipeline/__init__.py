"""The one request pipeline of every cached route (``core.py``) and its edge interface
(``call.py``); the routes' adapters live in ``gateway.adapters``."""

from gateway.pipeline.call import (
    BYPASS,
    COALESCED,
    HIT,
    MISS,
    STALE,
    Call,
    Fetched,
    FetchResult,
    Groups,
    Item,
    Outcome,
    Result,
)
from gateway.pipeline.core import Pipeline
from gateway.pipeline.freshness import overall_status

__all__ = [
    "BYPASS", "COALESCED", "HIT", "MISS", "STALE", "Call", "FetchResult", "Fetched", "Groups",
    "Item", "Outcome", "Pipeline", "Result", "overall_status",
]
