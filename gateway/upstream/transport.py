"""The transport seam: how the upstream client moves bytes to a backend and back.

One small interface, as httpx has it: ``Transport.send`` (one request, one complete answer) and
``close``. ``AiohttpTransport`` is production (one pooled keep-alive ``ClientSession``);
``GrpcTransport`` (grpc.py) carries the same exchanges to ``grpc://`` backends and
``SchemeTransport`` picks one of them per request by the backend URL's scheme;
``MemoryTransport`` answers from a Python function, so routing, failover, retries and the
pipeline are tested without sockets or subprocesses.

aiohttp's and grpcio's exceptions stop here; the client only ever sees this tree::

    TransportError          the exchange failed in some other way
    ├── ConnectError        no complete answer: the connection failed or was dropped
    │   ├── ConnectFailed   it could not be made: refused, unreachable, connect timeout
    │   │   └── ConnectTimeout  ... because the connect timed out (a slow host, not a dead one)
    │   └── Reset           made, then reset or closed before a complete answer
    └── ReadTimeout         connected, but no complete answer within the timeout

The retry policy tells the two kinds of ``ConnectError`` apart as Envoy's ``retry_on`` does
(``connect-failure``, ``reset``).

Cancellation (the caller's deadline) passes through untouched. ``send(..., bounded=True)``: the
caller bounds the exchange to at most ``timeout_s`` itself (an ``asyncio.timeout`` around the
call, as each try does), so a transport may leave out a timer of its own; aiohttp's per-call
total timeout (a ``ClientTimeout`` and a timer handle per call) is then not made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy


class TransportError(Exception):
    """A request to a backend produced no usable answer."""


class ConnectError(TransportError):
    """No complete answer: the connection failed or was dropped (see the subclasses)."""


class ConnectFailed(ConnectError):
    """The connection could not be made: refused, unreachable, or the connect timed out."""


class ConnectTimeout(ConnectFailed):
    """The connection was not made within the connect timeout: the health checker counts it as
    a timeout (maybe a slow host), not as a refusal (surely a dead one)."""


class Reset(ConnectError):
    """Connected, then the connection was reset or closed before a complete answer."""


class ReadTimeout(TransportError):
    """Connected, but the answer did not arrive within the read timeout."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a transport sees it."""

    method: str
    url: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete answer: status, body and headers (case-insensitive)."""

    status: int
    body: bytes
    headers: Mapping[str, str]


class Transport:
    """The interface (see the module docstring); subclasses implement ``send``."""

    async def send(self, request: Request, *, timeout_s: float, bounded: bool = False) -> Reply:
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections; the transport is unusable afterwards."""


class AiohttpTransport(Transport):
    """Production: one pooled keep-alive session for all backend traffic."""

    def __init__(self, session: aiohttp.ClientSession, *, connect_timeout_s: float) -> None:
        self.session = session
        self._connect_timeout_s = connect_timeout_s
        self._connect_only = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        """The timeout of a bounded call: the connect limit only (the caller's scope ends it)."""

    @classmethod
    def create(cls, *, pool_size: int, connect_timeout_s: float) -> AiohttpTransport:
        """The gateway's one session (call inside the running event loop)."""
        connector = aiohttp.TCPConnector(limit=pool_size, limit_per_host=pool_size,
                                         keepalive_timeout=60.0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        )
        return cls(session, connect_timeout_s=connect_timeout_s)

    async def send(self, request: Request, *, timeout_s: float, bounded: bool = False) -> Reply:
        timeout = self._connect_only if bounded else aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=self._connect_timeout_s)
        try:
            async with self.session.request(request.method, request.url, data=request.body,
                                            headers=request.headers, timeout=timeout) as resp:
                return Reply(resp.status, await resp.read(), resp.headers)
        except aiohttp.ConnectionTimeoutError as exc:
            raise ConnectTimeout(f"connect timeout: {type(exc).__name__}") from None
        except TimeoutError as exc:  # aiohttp's total/read timeouts
            raise ReadTimeout(type(exc).__name__) from None
        except aiohttp.ClientConnectorError as exc:
            raise ConnectFailed(type(exc).__name__) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Reset(type(exc).__name__) from None
        except aiohttp.ClientError as exc:
            raise TransportError(type(exc).__name__) from None

    async def close(self) -> None:
        await self.session.close()


class SchemeTransport(Transport):
    """Sends each request through the transport of its URL's scheme (``http``/``https``:
    ``AiohttpTransport``, ``grpc``: ``GrpcTransport``), so each backend keeps its protocol
    behind the one transport the client and the health checker hold."""

    def __init__(self, by_scheme: Mapping[str, Transport]) -> None:
        self.by_scheme = dict(by_scheme)

    def send(self, request: Request, *, timeout_s: float, bounded: bool = False,
             ) -> Coroutine[Any, Any, Reply]:
        # Not a coroutine of its own: it hands back the chosen transport's, so a call costs no
        # extra frame (raising at once for an unknown scheme, which callers await in a try).
        scheme, _, _ = request.url.partition("://")
        transport = self.by_scheme.get(scheme)
        if transport is None:
            raise TransportError(f"no transport for {scheme}:// URLs")
        return transport.send(request, timeout_s=timeout_s, bounded=bounded)

    async def close(self) -> None:
        for transport in dict.fromkeys(self.by_scheme.values()):  # each one once
            await transport.close()


Handler = Callable[[Request], Awaitable[Reply]]


class MemoryTransport(Transport):
    """Answers every request with ``handler`` (which may raise ``TransportError``s); records
    what was sent in ``requests``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    async def send(self, request: Request, *, timeout_s: float, bounded: bool = False) -> Reply:
        self.requests.append(request)
        reply = await self.handler(request)
        headers = CIMultiDictProxy(CIMultiDict(reply.headers))
        return Reply(reply.status, reply.body, headers)
