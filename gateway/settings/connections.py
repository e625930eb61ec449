"""Client connections (section ``connections``): read deadlines, idle keep-alive, and a cap.

aiohttp bounds none of these by default in a way that helps a gateway: it has no deadline for
the request head at all, none for a body that trickles in, and keeps an idle connection for 75
seconds. A client that sends one header line, or one body byte, every few seconds would hold a
file descriptor for ever; enough of them exhaust the worker. ``gateway/http/routes/connection.py``
enforces these per connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import validation as check


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionSettings:
    """Per worker process; each connection is one file descriptor."""

    header_timeout_s: float = 10.0
    """From the first byte of a request head to its end; past it: 408 and the connection closes."""
    body_timeout_s: float = 30.0
    """From the end of the head to the end of the body (the whole body, however it trickles);
    past it: 408 and close. A 64 MiB batch upload needs about 2.2 MB/s at the default."""
    keepalive_timeout_s: float = 30.0
    """An idle connection (no request in progress) is closed after this long."""
    max_per_worker: int = 1024
    """Open client connections per worker; one more is answered 503 (Retry-After) and closed.
    Keep it under the worker's file-descriptor limit (``ulimit -n``) less the backend pool."""

    backlog: int = 1024
    """Connections the kernel may hold, established but not yet accepted, per listening socket
    (``listen``'s backlog; the kernel caps it at ``net.core.somaxconn``). aiohttp's 128 let a
    burst of 300 new connections overflow it, and every connection past it waited for the
    client's SYN retransmit, a second later (issue 23's deadline burst)."""

    def __post_init__(self) -> None:
        check.positive("header_timeout_s", self.header_timeout_s, upper=3600)
        check.positive("body_timeout_s", self.body_timeout_s, upper=86400)
        check.positive("keepalive_timeout_s", self.keepalive_timeout_s, upper=3600)
        check.at_least("max_per_worker", self.max_per_worker, 1)
        check.between("backlog", self.backlog, 1, 65535)
