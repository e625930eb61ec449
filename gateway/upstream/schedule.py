"""What every backend call says about its scheduling: priority, fairness key and deadline.

The backend's queue is where waiting happens (docs/SCHEDULING.md), so each call tells it:

- ``priority`` (Triton's numbering: 1 highest): the tenant's ``route_priority`` for the route,
  else its ``backend_priority``, else the gateway's number for the call's class (the lower of
  the call's and the tenant's: ``interactive`` 1, ``batch`` 3 by default:
  ``routing.backend_priority_*``). Batch API lines never rise above
  the batch number. A client's own ``priority`` parameter may only lower its request's
  priority (a larger number), never raise it.
- ``fairness_key``: a keyed hash of the tenant id, never the id itself: the backend shares
  its batches fairly between keys without learning who the tenants are.
- ``express`` (true, or absent): with ``admission.express``, an interactive call of a tenant
  whose last call got a slot at once (no backlog of its calls in the gateway): the backend's
  express lane (``BACKEND_EXPRESS_LANE``) may compute it beside the batch in compute. Two
  tenants evenly busy both queue in the gateway, so neither is sent as express and neither
  computes texts alone beside the other's batch; a quiet tenant beside a flood is.
- the remaining deadline travels as ``X-Request-Timeout-Ms`` (REST) or the call's gRPC deadline,
  set per try by the client (client.py); a client's ``timeout`` parameter may only shorten it.

Pure: no I/O. ``Schedule.params`` is what the client adds to the body's ``parameters``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from gateway.upstream.admission.fairqueue import BATCH, INTERACTIVE, Priority, lower

TenantPriority = Callable[[str], tuple[Priority, int | None, Mapping[str, int]]]
"""A tenant's class, ``backend_priority`` and ``route_priority`` (the tenants file)."""

PRIORITY = "priority"
TIMEOUT = "timeout"
FAIRNESS_KEY = "fairness_key"
EXPRESS = "express"
SCHEDULE_PARAMETERS = (PRIORITY, TIMEOUT, FAIRNESS_KEY, EXPRESS)
"""OIP request parameters the gateway sets itself: a client's are never passed on as sent."""


@functools.lru_cache(maxsize=4096)
def fairness_key(tenant: str, salt: str = "") -> str:
    """A stable, opaque key for ``tenant``: 96 bits of BLAKE2b keyed by ``salt``."""
    digest = hashlib.blake2b(tenant.encode(), digest_size=12,
                             key=salt.encode()[:64] if salt else b"")
    return digest.hexdigest()


class Schedule:
    """Resolves a call's backend priority and fairness key (see the module doc)."""

    def __init__(self, *, interactive: int = 1, batch: int = 3, salt: str = "",
                 tenant_priority: TenantPriority | None = None) -> None:
        self._by_class: dict[Priority, int] = {INTERACTIVE: interactive, BATCH: batch}
        self._batch = batch
        self._salt = salt
        self._tenant_priority = tenant_priority

    def priority(self, tenant: str, route: str, cls: Priority, client: int = 0) -> int:
        """The backend priority of a call; ``client`` is the request's own (0: none)."""
        own: int | None = None
        routes: Mapping[str, int] = {}
        if self._tenant_priority is not None:
            tenant_class, own, routes = self._tenant_priority(tenant)
            cls = lower(cls, tenant_class)  # a batch tenant's calls stay batch
        number = self._by_class[cls]
        if own is not None or routes:
            routed = routes.get(route) if routes else None
            if routed is not None:
                number = routed
            elif own is not None:
                number = own
        if cls == BATCH:
            number = max(number, self._batch)
        return max(number, client)  # a client may only lower its own priority

    def params(self, tenant: str, route: str, cls: Priority, client: int = 0, *,
               express: bool = False) -> dict[str, Any]:
        """The OIP request parameters a backend call carries (``express`` only when true)."""
        params = {PRIORITY: self.priority(tenant, route, cls, client),
                  FAIRNESS_KEY: fairness_key(tenant, self._salt)}
        if express:
            params[EXPRESS] = True
        return params


def client_schedule(parameters: object) -> tuple[int, float | None]:
    """A client's own ``priority`` and ``timeout`` (seconds; None: none) from an OIP body's
    ``parameters``, ignoring values that are not non-negative integers (the adapter rejects
    those with a 422 first)."""
    if not isinstance(parameters, dict):
        return 0, None
    priority = parameters.get(PRIORITY, 0)
    timeout = parameters.get(TIMEOUT, 0)
    priority = priority if _count(priority) else 0
    return priority, (timeout / 1e6 if _count(timeout) and timeout else None)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
