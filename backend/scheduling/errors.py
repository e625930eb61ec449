"""The scheduler's own errors; the data plane maps them to the backend's (``errors.py``).

    SchedulingError
    ├── QueueFull            the request's priority queue cannot take it now (503)
    │   └── WouldMissDeadline  the work ahead of it already outlasts its deadline (503, at once)
    ├── DeadlineExpired      its deadline passed, or would pass, before its compute (504)
    └── BatcherClosed        shutting down (503)
"""

from __future__ import annotations


class SchedulingError(Exception):
    """Base of the scheduler's own errors (callers map them to their protocol)."""


class QueueFull(SchedulingError):
    """The queue cannot take the request now; ``retry_after_s`` estimates when it could."""

    reason = "queue_full"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class WouldMissDeadline(QueueFull):
    """Refused on arrival: the work queued ahead of it, at its fair share, would take longer
    than its remaining deadline, so it is told now rather than when the deadline passes."""

    reason = "deadline"


class DeadlineExpired(SchedulingError):
    """The request's deadline passed, or its compute could not end before it."""


class BatcherClosed(SchedulingError):
    """The batcher is shutting down."""
