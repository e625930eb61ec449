"""The settings section ``admission``: ``AdmissionSettings``, checked when loaded.

How many backend calls each locality tier lets through, how many may wait, and the adaptive
limit's settings (gateway/upstream/admission/adaptive.py); ``Admission`` (control.py) reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway import validation as check
from gateway.upstream.admission.adaptive import AdaptiveSettings


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionSettings:
    """How many backend calls each locality tier lets through, and how many wait (settings
    section ``admission``). Each worker process keeps its own counts."""

    tier_concurrency: int = 64
    """Backend calls in flight per tier before requests queue; with ``adaptive.enabled``, the
    ceiling the adaptive limit moves under."""
    tier_queue: int = 256
    """Requests that may wait per tier; more are shed at once (503 with Retry-After)."""
    max_wait_factor: float = 1.0
    """An interactive request whose expected wait in the queue exceeds this many times the
    tier's recent service time is shed at once (503 with Retry-After, ``reason="wait"``), if
    its tenant is past its share of the tier's limit: under overload the surplus is told at
    once, and what is admitted waits about as long as at moderate load (4 before 2026-12-05:
    admitted requests at 3x capacity then waited ~4 service times, p50 120-220 ms against
    55-75 ms at 1; bench/RESULTS.md). 0: no bound but the request's deadline. Batch-class
    calls wait up to their deadline."""
    refusal_hold_s: float = 0.25
    """How long a request refused for its tenant's backlog (``wait``, ``queue_full``) is held
    before its 503 goes out (at most its ``Retry-After``, which is shortened by the hold). A
    client that resends at once, ignoring ``Retry-After``, then cannot turn refusals into a
    loop that takes the core the model computes on: a held refusal costs a socket and a
    timer, not CPU. Refusals for the request's own deadline are never held. 0: answer at
    once."""
    refuse_at_read: bool = True
    """A request that the early refusal (``Admission.refuse_early``: its tenant's backlog, or
    its deadline) would refuse is refused as its head and body are read, before aiohttp builds
    a request for it (gateway/http/gate.py): ~3x fewer instructions a refusal, whose CPU under
    overload comes out of the answers on a core the model shares. While its tenant is
    refused, its repeats that the hot-answer cache holds are refused too, and a body the app
    would answer 4xx gets the 503 (the full path judges the early refusal after the hot answer
    and the parse). false: every request takes the full path."""
    express: bool = False
    """For backends that run the express lane (``BACKEND_EXPRESS_LANE``): an interactive call
    of a tenant holding no slot in the tier gets one at once while the other tenants' calls
    in flight stay under ``tier_concurrency`` plus the interactive reserve (a quarter of it),
    whatever the learned limit (as with the adaptive limit off); so does a tenant holding
    slots that took less than its weighted share of the tier's calls in the last two seconds,
    its own slots then bounded by its share of ``tier_concurrency``. Such a backend computes
    that call beside the batch in compute; without this, a quiet tenant beside a flood waits
    in the gateway whenever the learned limit falls below the flood's slots. An interactive
    call of a tenant whose last call got a slot at once goes with the OIP parameter
    ``express: true`` (``Admission.quiet``), the only calls at the batch's own level the lane
    takes: a flood, or two tenants evenly busy, queue here and do not (docs/SCHEDULING.md)."""
    adaptive: AdaptiveSettings = field(default_factory=AdaptiveSettings)
    """The adaptive concurrency limit per tier (gateway/upstream/admission/adaptive.py), on by
    default: the calls in flight follow what the backends can use, and the surplus waits in
    the gateway's fair queue, where priority, fairness and the wait bound act."""

    def __post_init__(self) -> None:
        check.at_least("tier_concurrency", self.tier_concurrency, 1)
        check.at_least("tier_queue", self.tier_queue, 0)
        check.between("max_wait_factor", self.max_wait_factor, 0, 1000)
        check.between("refusal_hold_s", self.refusal_hold_s, 0, 60)
        check.boolean("refuse_at_read", self.refuse_at_read)
        check.boolean("express", self.express)
