"""How a model's queue is scheduled: priority levels with their own bounds and timeouts, the
fairness weight, the batch-forming window and the compute bound on one batch.

Priorities follow Triton's schedule-policy extension: 1 is the highest, larger numbers are
lower, 0 means the model's default. A priority past the lowest level is served at the lowest
(so a caller that asks for "the lowest" with a large number gets it on any server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

FairBy = Literal["tokens", "texts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelPolicy:
    """One priority level's queue: at most ``max_queue_size`` items waiting, and a deadline of
    ``default_timeout_s`` for requests that bring none."""

    max_queue_size: int
    default_timeout_s: float
    # The compute bound of a batch that starts at this level (its highest-priority item is of
    # this level), as ``SchedulePolicy.max_batch_compute_s``; None: that one.
    max_batch_compute_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePolicy:
    """A model queue's whole policy; ``levels[0]`` is priority 1."""

    levels: tuple[LevelPolicy, ...]
    default_priority: int = 1
    # What fairness between keys counts: tokens (compute, as VTC does) or texts.
    fair_by: FairBy = "tokens"
    # While a worker is free and fewer items wait than a full batch, how long the oldest may
    # wait for company (Triton's max_queue_delay). A request that finds the worker idle and
    # nothing waiting is dispatched at once all the same.
    max_queue_delay_s: float = 0.0
    # Expected compute seconds, beyond one call's fixed cost, past which a batch takes no more
    # items (one item at least): a request arriving behind it waits at most about this long
    # plus that fixed cost. 0: no bound.
    max_batch_compute_s: float = 0.0
    # While two or more fairness keys have sent within ``active_window_s``, a batch's compute
    # bound is at most this (a request of one arrives behind a shorter batch of another's);
    # one key alone keeps its level's bound. 0: no such bound.
    shared_batch_compute_s: float = 0.0
    active_window_s: float = 1.0
    names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a schedule needs at least one priority level")
        if not 1 <= self.default_priority <= len(self.levels):
            raise ValueError(f"default priority {self.default_priority} is not a level "
                             f"(1..{len(self.levels)})")
        for level in self.levels:
            if level.max_queue_size < 1 or level.default_timeout_s <= 0:
                raise ValueError("every level needs a queue size >= 1 and a timeout > 0")
            if level.max_batch_compute_s is not None and level.max_batch_compute_s < 0:
                raise ValueError("a level's max_batch_compute must be >= 0")
        if (self.max_queue_delay_s < 0 or self.max_batch_compute_s < 0
                or self.shared_batch_compute_s < 0):
            raise ValueError("max_queue_delay, max_batch_compute and shared_batch_compute "
                             "must be >= 0")
        if self.active_window_s <= 0:
            raise ValueError("active_window must be > 0")

    def budget_of(self, level: int) -> float:
        """The compute bound of a batch whose highest-priority item is of ``level`` (0-based):
        the level's own, else ``max_batch_compute_s`` (0: none)."""
        own = self.levels[level].max_batch_compute_s
        return self.max_batch_compute_s if own is None else own

    def level_of(self, priority: int) -> int:
        """The 0-based level serving ``priority`` (0: the default; past the lowest: lowest)."""
        if priority < 0:
            raise ValueError(f"priority must be >= 0, got {priority}")
        if priority == 0:
            priority = self.default_priority
        return min(priority, len(self.levels)) - 1

    @classmethod
    def uniform(cls, *, levels: int = 1, max_queue_size: int, default_timeout_s: float,
                queue_sizes: Sequence[int] = (), timeouts_s: Sequence[float] = (),
                batch_compute_s: Sequence[float] = (),
                **options: object) -> SchedulePolicy:
        """``levels`` levels with the same bound and timeout unless ``queue_sizes``,
        ``timeouts_s`` or ``batch_compute_s`` give them per level (highest first; a short list
        repeats its last; no ``batch_compute_s``: every level uses ``max_batch_compute_s``)."""
        def pick(values: Sequence[float], index: int, default: float) -> float:
            return values[min(index, len(values) - 1)] if values else default

        return cls(levels=tuple(
            LevelPolicy(max_queue_size=int(pick(queue_sizes, i, max_queue_size)),
                        default_timeout_s=pick(timeouts_s, i, default_timeout_s),
                        max_batch_compute_s=(batch_compute_s[min(i, len(batch_compute_s) - 1)]
                                             if batch_compute_s else None))
            for i in range(levels)), **options)  # type: ignore[arg-type]
