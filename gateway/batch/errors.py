"""The batch routes' own errors, in the gateway's one hierarchy (gateway/errors.py)::

    GatewayError
    ├── Conflict (409 conflict)                      the object's state forbids the change
    └── BatchUnavailable (503 batch_unavailable)     no Redis configured, or it is unreachable

Everything else the routes raise is a gateway error already (404 for an unknown or another
tenant's id, 413 for limits, 422 for a bad field, 429 for too many unfinished batches).
"""

from __future__ import annotations

import math

from gateway.errors import GatewayError


class Conflict(GatewayError):
    status = 409
    type = "conflict"


class BatchUnavailable(GatewayError):
    """The batch routes cannot work now; the message names what to set or that Redis is
    unreachable (the routes never name its address)."""

    status = 503
    type = "batch_unavailable"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}
