"""The per-request scheduling parameters as the Open Inference Protocol carries them, REST and
gRPC alike: Triton's schedule-policy names ``priority`` (1 highest, 0 the model's default) and
``timeout`` (microseconds, 0 none), and ``fairness_key``, an opaque string (the gateway sends a
hash of its tenant) whose requests are served fairly against other keys'; and ``express``, a
boolean: the caller judges the request's key quiet (its gateway sent it without a backlog of
that tenant's calls waiting, ``admission.express``), so the express lane may compute it beside
the batch in compute when its key was served less lately (``BACKEND_EXPRESS_LANE``; without
it, the lane takes only requests at a better priority than that batch).

Pure: values in, values out; a bad value raises ``BadRequest`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.errors import BadRequest

PRIORITY = "priority"
TIMEOUT = "timeout"
FAIRNESS_KEY = "fairness_key"
EXPRESS = "express"
MAX_KEY_LENGTH = 128
# Far past any priority level a server configures; bounds what a caller can send.
MAX_PRIORITY = 1 << 20
MAX_TIMEOUT_US = 600_000_000  # ten minutes, the X-Request-Timeout-Ms bound


@dataclass(frozen=True, slots=True)
class ScheduleParams:
    """A request's scheduling parameters; the zero values mean "not given"."""

    priority: int = 0
    timeout_us: int = 0
    fairness_key: str = ""
    express: bool = False

    def timeout_s(self, header_s: float | None) -> float | None:
        """The request's timeout: the shorter of the header's and the parameter's (None:
        neither given, the priority level's default applies)."""
        own = self.timeout_us / 1e6 if self.timeout_us else None
        if own is None or header_s is None:
            return own if header_s is None else header_s
        return min(own, header_s)


NONE = ScheduleParams()


def parse_schedule(parameters: Mapping[str, Any]) -> ScheduleParams:
    """The scheduling parameters from a request's ``parameters`` (plain values)."""
    if PRIORITY not in parameters and TIMEOUT not in parameters \
            and FAIRNESS_KEY not in parameters and EXPRESS not in parameters:
        return NONE
    priority = _integer(parameters, PRIORITY, MAX_PRIORITY)
    timeout_us = _integer(parameters, TIMEOUT, MAX_TIMEOUT_US)
    key = parameters.get(FAIRNESS_KEY, "")
    if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"parameter {FAIRNESS_KEY!r} must be a string of at most "
                         f"{MAX_KEY_LENGTH} characters")
    express = parameters.get(EXPRESS, False)
    if not isinstance(express, bool):
        raise BadRequest(f"parameter {EXPRESS!r} must be a boolean")
    return ScheduleParams(priority, timeout_us, key, express)


def _integer(parameters: Mapping[str, Any], name: str, limit: int) -> int:
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise BadRequest(f"parameter {name!r} must be an integer in [0, {limit}]")
    return value
