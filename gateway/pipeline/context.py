"""Per-request context: id, tenant, deadline, client cache directives, and Server-Timing marks."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.policy.headers import RequestHeaders
from gateway.upstream.admission.fairqueue import INTERACTIVE, Priority

# [0-9], not \d: \d matches every Unicode digit ("max-age=٣").
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?([0-9]+)\"?\s*(?:,|$)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class CacheDirectives:
    """What the client's ``Cache-Control`` asks of the cache.

    ``no-store``: neither read nor write. ``no-cache``: do not answer from cache, refresh it.
    ``max-age=N``: only entries at most N seconds old may answer.
    """

    no_store: bool = False
    no_cache: bool = False
    max_age: float | None = None

    @classmethod
    def parse(cls, header: str | None) -> CacheDirectives:
        if not header:
            return _NONE
        low = header.lower()
        tokens = {t.strip().split("=", 1)[0] for t in low.split(",")}
        m = _MAX_AGE.search(low)
        return cls(
            no_store="no-store" in tokens,
            no_cache="no-cache" in tokens,
            max_age=float(m.group(1)) if m else None,
        )

    @property
    def may_read(self) -> bool:
        return not (self.no_store or self.no_cache)

    @property
    def may_write(self) -> bool:
        return not self.no_store


_NONE = CacheDirectives()


@dataclass(slots=True)
class RequestContext:
    """Everything the pipeline needs to know about one request besides its body."""

    request_id: str
    route: str
    tenant: str = "public"
    headers: RequestHeaders = field(default_factory=RequestHeaders)
    """The request's headers as every stage reads them (one reading, all values)."""
    deadline: float = 0.0
    """``time.monotonic()`` instant after which the request has failed (504)."""
    directives: CacheDirectives = _NONE
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    """Server-Timing entries, milliseconds by name (parse, policy, cache, queue, upstream...)."""
    cache_status: str = ""
    policy_tag: str = ""
    priority: Priority = INTERACTIVE
    """Admission class of its backend calls: ``interactive``, or ``batch`` (batch jobs)."""
    charge: Callable[[int, int], Awaitable[None]] | None = None
    """Called once per request after the cache lookup, before any backend call, with (texts
    going to a backend, texts answered from cache): the tenant's quota charge (may raise 429)."""

    def add_timing(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds * 1000.0

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def server_timing(self) -> str:
        total = (time.perf_counter() - self.started) * 1000.0
        parts = [f"{name};dur={ms:.3f}" for name, ms in self.timings.items()]
        parts.append(f"total;dur={total:.3f}")
        return ", ".join(parts)
