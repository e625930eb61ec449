"""Scheduling inside the model server: priority levels, fairness between keys, deadlines and
dynamic batching. ``queue.py`` decides what the next batch holds (pure, clock passed in);
``batcher.py`` decides when it goes and runs it on worker threads; ``cost.py`` learns what a
batch costs; ``policy.py`` is the configuration. See docs/SCHEDULING.md.
"""

from backend.scheduling.batcher import DynamicBatcher
from backend.scheduling.delivery import BatchOutcome
from backend.scheduling.errors import (
    BatcherClosed,
    DeadlineExpired,
    QueueFull,
    SchedulingError,
    WouldMissDeadline,
)
from backend.scheduling.observer import BatchObserver, NullObserver
from backend.scheduling.policy import LevelPolicy, SchedulePolicy

__all__ = [
    "BatchObserver", "BatchOutcome", "BatcherClosed", "DeadlineExpired", "DynamicBatcher",
    "LevelPolicy", "NullObserver", "QueueFull", "SchedulePolicy", "SchedulingError",
    "WouldMissDeadline",
]
