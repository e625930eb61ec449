"""One request's items as they pass the pipeline's stages (core.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.pipeline.call import Outcome
from gateway.policy import Decision


@dataclass(slots=True)
class Plan:
    """One request's items between the stages: their keys, which positions share a key, which
    keys the cache may hold (``kept``; none when the policy or the client keeps it out, else
    those whose every item the policy lets be stored), and each position's entry and answer."""

    decision: Decision
    keys: list[CacheKey]
    positions: dict[CacheKey, list[int]]
    kept: list[CacheKey]
    entries: list[Entry | None] = field(default_factory=list)
    outcomes: list[Outcome | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.entries = [None] * len(self.keys)
        self.outcomes = [None] * len(self.keys)

    def missing(self) -> list[CacheKey]:
        """The unique keys no cache answered."""
        return [k for k, pos in self.positions.items() if self.outcomes[pos[0]] is None]
