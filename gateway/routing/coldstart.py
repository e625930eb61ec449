"""A backend's cold start as the gateway sees it: its first answers after it becomes ready.

A backend becomes ready when its health checks pass after failing (it was starting, warming
up, or down). From then its first ``COLD_ANSWERS`` successful answers are its cold start: the
router labels their latency ``phase="cold"`` and every later one ``phase="steady"``
(``gateway_backend_answer_seconds``), so a restart's slow answers neither hide in nor skew the
steady-state percentiles. A backend already ready when the gateway starts is not cold (nothing
says it is; slow start follows the same rule). The gateway's stats JSON shows, per backend, how
often it became ready, whether it is cold now, how long after ready its first answer came, and
the cold and steady percentiles side by side.

State is per worker process: each worker runs its own health checks and sees the same changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Phase = Literal["cold", "steady"]
COLD_ANSWERS = 100


@dataclass(slots=True)
class ColdStart:
    """One backend's cold-start state.

    Attributes:
        readies: times it became ready since the gateway started.
        ready_at: clock time it last became ready; None if never (since start).
        answers: successful answers since then, counted up to ``COLD_ANSWERS``.
        first_answer_after_s: seconds from ready to its first answer; None until then.
    """

    readies: int = 0
    ready_at: float | None = None
    answers: int = COLD_ANSWERS  # not cold until it becomes ready
    first_answer_after_s: float | None = None

    def became_ready(self, now: float) -> None:
        """Its health checks passed after failing: a cold start begins."""
        self.readies += 1
        self.ready_at = now
        self.answers = 0
        self.first_answer_after_s = None

    def answered(self, now: float) -> Phase:
        """A successful answer ended at ``now``: the phase its latency belongs to."""
        if self.answers >= COLD_ANSWERS:
            return "steady"
        self.answers += 1
        if self.answers == 1 and self.ready_at is not None:
            self.first_answer_after_s = max(0.0, now - self.ready_at)
        return "cold"

    @property
    def cold(self) -> bool:
        """True while its first answers after ready are still coming."""
        return self.answers < COLD_ANSWERS

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON for the stats page."""
        return {
            "readies": self.readies,
            "cold": self.cold,
            "cold_answers": self.answers if self.ready_at is not None else 0,
            "ready_for_s": None if self.ready_at is None else max(0.0, now - self.ready_at),
            "first_answer_after_ready_s": self.first_answer_after_s,
        }
