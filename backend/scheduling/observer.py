"""Hooks through which the batcher reports what it does; ``backend/metrics.py`` implements them.

Levels are 0-based here (level 0 serves priority 1); the metrics label them by priority.
"""

from __future__ import annotations

from typing import Protocol


class BatchObserver(Protocol):
    """Called on the event loop. Queue depths are read, not pushed (``DynamicBatcher.depth_of``).

    ``dropped`` reasons: ``expired`` (its deadline passed while queued), ``late`` (when its turn
    came its compute could not end before its deadline). ``rejected`` reasons: ``queue_full``,
    ``deadline`` (refused on arrival: the work ahead outlasts its deadline).
    ``express_batch``: a batch of ``size`` items went to the express lane.
    """

    def batch_computed(self, size: int, compute_s: float) -> None: ...

    def waited(self, level: int, seconds: float) -> None: ...

    def dropped(self, level: int, reason: str) -> None: ...

    def rejected(self, level: int, reason: str) -> None: ...

    def express_batch(self, size: int) -> None: ...


class NullObserver:
    """Reports nowhere."""

    def batch_computed(self, size: int, compute_s: float) -> None:
        pass

    def waited(self, level: int, seconds: float) -> None:
        pass

    def dropped(self, level: int, reason: str) -> None:
        pass

    def rejected(self, level: int, reason: str) -> None:
        pass

    def express_batch(self, size: int) -> None:
        pass
