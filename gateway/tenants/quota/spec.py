"""What the tenants file says about a tenant besides its keys: quota, fair-share weight, class.

```yaml
defaults:                 # every tenant's, unless it sets its own (each key may be left out)
  weight: 1               # its share of a busy tier's backend slots, against the others'
  priority: interactive   # interactive | batch (batch waits while interactive calls queue)
  backend_priority: 1     # the backend scheduling priority of its calls (1 highest);
                          # default: routing.backend_priority_interactive / _batch by class
  route_priority: {"/v1/rank": 2}   # per route, over backend_priority
  quota:
    requests_per_s: 20    # sustained rate...
    requests_burst: 40    # ...and how many may come at once (default: one second's worth)
    texts_per_s: 200      # texts sent to a backend (cache hits: quotas.hit_cost each)
    texts_burst: 400
    texts_per_day: 1000000  # per UTC day
tenants:
  acme:
    api_keys_sha256: ["<64 hex>"]
    weight: 2
    quota: {texts_per_s: 500, texts_per_day: null}   # key by key over defaults; null: no limit
```

A quota key left out (in the tenant and in ``defaults``) is no limit. ``parse_spec`` checks one
mapping and reports each problem through a callback that knows the file and line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.upstream.admission.fairqueue import INTERACTIVE, PRIORITIES, Priority

Problem = Callable[[list[str | int], str], None]
"""Report a problem at a path inside the file (``["tenants", "acme", "weight"]``)."""

QUOTA_FIELDS = ("requests_per_s", "requests_burst", "texts_per_s", "texts_burst",
                "texts_per_day")
SPEC_FIELDS = ("weight", "priority", "quota", "backend_priority", "route_priority")
MAX_BACKEND_PRIORITY = 1 << 20  # what the backend accepts (backend/scheduling/params.py)
MAX_WEIGHT = 1000.0
MIN_WEIGHT = 0.001


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """A tenant's limits; ``None`` is no limit."""

    requests_per_s: float | None = None
    """Requests per second, sustained (every request counts, cache hits too)."""
    requests_burst: int | None = None
    """Requests that may come at once; default: one second's worth (at least 1)."""
    texts_per_s: float | None = None
    """Texts per second sent to a backend (a cache hit costs ``quotas.hit_cost``)."""
    texts_burst: int | None = None
    """Texts that may come at once; default: one second's worth (at least 1)."""
    texts_per_day: int | None = None
    """Texts per UTC day, counted like ``texts_per_s``."""

    @property
    def limited(self) -> bool:
        """True when any limit is set."""
        return (self.requests_per_s is not None or self.texts_per_s is not None
                or self.texts_per_day is not None)

    @staticmethod
    def burst_of(rate: float | None, burst: int | None) -> int:
        """A limit's burst: as given, else one second's worth of its rate (at least 1)."""
        if burst is not None:
            return burst
        return max(1, math.ceil(rate or 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantSpec:
    """One tenant's quota, fair-share weight and priority class."""

    weight: float = 1.0
    """Share of a busy tier's slots relative to the other tenants waiting there."""
    priority: Priority = INTERACTIVE
    """``interactive`` or ``batch``: batch calls wait while interactive ones queue."""
    quota: Quota = field(default_factory=Quota)
    """Rate and daily limits (none by default)."""
    backend_priority: int | None = None
    """The backend scheduling priority of its calls (1 highest, Triton's numbering); None:
    the gateway's number for its class (``upstream.schedule``). Docs: docs/SCHEDULING.md."""
    route_priority: Mapping[str, int] = field(default_factory=dict)
    """Per route (``/v1/embeddings``, ``/v2/models/{name}/infer``...), overriding
    ``backend_priority`` there."""


def _number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _quota(data: object, where: list[str | int], base: Quota, problem: Problem) -> Quota:
    if not isinstance(data, dict):
        problem(where, f"expected a mapping of {', '.join(QUOTA_FIELDS)}")
        return base
    values: dict[str, Any] = {}
    for key, value in data.items():
        at = [*where, str(key)]
        if key not in QUOTA_FIELDS:
            problem(at, f"unknown field; allowed: {', '.join(QUOTA_FIELDS)}")
        elif value is None:
            values[key] = None
        elif key.endswith("_per_s"):
            if not _number(value) or value <= 0:
                problem(at, f"must be a number > 0, or null for no limit (got {value!r})")
            else:
                values[key] = float(value)
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problem(at, f"must be an integer >= 1, or null (got {value!r})")
        else:
            values[key] = value
    return replace(base, **values)


def parse_spec(data: Mapping[str, Any], where: list[str | int], base: TenantSpec,
               problem: Problem) -> TenantSpec:
    """``base`` with what ``data`` (a tenant's or the defaults' mapping) sets; fields other
    than ``weight``, ``priority`` and ``quota`` are the caller's to check."""
    spec = base
    if "weight" in data:
        weight = data["weight"]
        if not _number(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            problem([*where, "weight"],
                    f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} (got {weight!r})")
        else:
            spec = replace(spec, weight=float(weight))
    if "priority" in data:
        priority = data["priority"]
        if priority not in PRIORITIES:
            problem([*where, "priority"],
                    f"must be one of {', '.join(PRIORITIES)} (got {priority!r})")
        else:
            spec = replace(spec, priority=priority)
    if "quota" in data:
        spec = replace(spec, quota=_quota(data["quota"], [*where, "quota"], spec.quota, problem))
    if "backend_priority" in data:
        value = data["backend_priority"]
        if _backend_priority(value, [*where, "backend_priority"], problem):
            spec = replace(spec, backend_priority=value)
    if "route_priority" in data:
        routes = data["route_priority"]
        if not isinstance(routes, dict) or not all(isinstance(k, str) for k in routes):
            problem([*where, "route_priority"], "expected a mapping of route to priority")
        elif all(_backend_priority(v, [*where, "route_priority", k], problem)
                 for k, v in routes.items()):
            spec = replace(spec, route_priority=dict(routes))
    return spec


def _backend_priority(value: object, where: list[str | int], problem: Problem) -> bool:
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 1 <= value <= MAX_BACKEND_PRIORITY:
        problem(where, f"must be an integer from 1 (highest) to {MAX_BACKEND_PRIORITY} "
                       f"(got {value!r})")
        return False
    return True
