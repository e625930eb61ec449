"""The one request pipeline of every cached route (``core.py``) and its edge interface
(``call.py``); the routes' adapters live in ``gateway.adapters``."""

from gateway.pipeline.call import (
    BYPASS,
    COALESCED,
    HIT,
    MISS,
    PER_TEXT,
    STALE,
    Call,
    Fetched,
    FetchResult,
    Groups,
    Item,
    Outcome,
    PerRequest,
    PerText,
    Result,
    Unit,
)
from gateway.pipeline.core import Pipeline
from gateway.pipeline.freshness import overall_status

__all__ = [
    "BYPASS", "COALESCED", "HIT", "MISS", "PER_TEXT", "STALE", "Call", "FetchResult", "Fetched",
    "Groups", "Item", "Outcome", "PerRequest", "PerText", "Pipeline", "Result", "Unit",
    "overall_status",
]
