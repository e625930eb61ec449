"""A lean HTTP/1.1 transport for ``http://`` backends (``routing.http_client: lean``).

What a backend call costs in the gateway is mostly the client library's machinery (issue 24:
aiohttp's ``request`` is ~0.4M instructions per miss). This transport keeps only what a call to
a known backend needs: one ``asyncio.Protocol`` per kept-alive connection, a small pool per
``(host, port)`` (bounded, LIFO reuse, idle connections closed after ``keepalive_s``), the
request written as one bytes buffer, and the answer parsed with ``httptools`` (llhttp, the
parser uvicorn uses). Content-Length and chunked bodies of any size, repeated headers,
``Connection: close`` answers and HTTP/1.0 peers are handled by the parser.

Errors map onto the transport's tree (transport.py) as ``AiohttpTransport`` maps aiohttp's:
refused/unreachable -> ``ConnectFailed``, a connect past ``connect_timeout_s`` ->
``ConnectTimeout``, closed or reset before a complete answer (or an answer that does not parse)
-> ``Reset``, no complete answer within ``timeout_s`` (unbounded calls) -> ``ReadTimeout``.
A kept-alive connection the server closed while idle is retried once on a fresh connection,
and only when nothing of the answer was read (as aiohttp does for a reused connection).
Cancellation drops the connection (never back to the pool) and passes through.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast
from urllib.parse import quote

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.upstream.transport import (
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    Reply,
    Request,
    Reset,
    Transport,
    TransportError,
)

_URL_CACHE_MAX = 1024
_PATH_SAFE = "!$%&'()*+,/:;=?@~"
"""Kept as they are in a path and query (with letters, digits and ``_.-~``); the rest of a
non-ASCII or spaced path is percent-encoded from UTF-8."""


class _Stale(Exception):
    """A reused connection closed before any byte of the answer: safe to send again."""


class _Conn(asyncio.Protocol):
    """One kept-alive connection; one exchange at a time."""

    __slots__ = (
        "chunks",
        "closed",
        "complete",
        "got",
        "headers",
        "idle_since",
        "keep_alive",
        "parser",
        "reused",
        "status",
        "transport",
        "waiter",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.got = False
        """Some byte of the current answer arrived."""
        self.complete = False
        self.closed = False
        self.keep_alive = True
        self.reused = False
        self.idle_since = 0.0

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.got = True
        if self.waiter is None:  # bytes nobody asked for: the connection is unusable
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._finish(Reset("upgrade"))
        except httptools.HttpParserError as exc:
            self._finish(Reset(f"bad answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if not self.got:
                self.waiter.set_exception(_Stale() if self.reused else Reset("closed"))
            else:
                self.waiter.set_exception(Reset("closed before a complete answer"))

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.headers = []
            self.chunks = []
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # ---

    def _finish(self, error: BaseException) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if self.transport is not None:
            self.transport.abort()

    def start(self, payload: bytes, waiter: asyncio.Future[None]) -> None:
        self.waiter = waiter
        self.status = 0
        self.headers = []
        self.chunks = []
        self.got = False
        self.complete = False
        assert self.transport is not None
        self.transport.write(payload)

    def drop(self) -> None:
        self.closed = True
        self.waiter = None
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """The connections to one ``(host, port)``: at most ``limit``, idle ones reused LIFO."""

    __slots__ = (
        "closed",
        "connect_timeout_s",
        "host",
        "idle",
        "keepalive_s",
        "limit",
        "open",
        "port",
        "sweep",
        "waiters",
    )

    def __init__(self, host: str, port: int, *, limit: int, keepalive_s: float,
                 connect_timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Conn] = []
        self.open = 0
        """Connections counted against ``limit``: idle, busy and being made."""
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.sweep: asyncio.TimerHandle | None = None
        self.closed = False
        """The transport closed: connections still busy are closed when they come back."""

    def _reuse(self) -> _Conn | None:
        """The most recently idle connection still open (closed ones are counted out)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
            self.open -= 1
        return None

    async def acquire(self, fresh: bool = False) -> _Conn:
        if not fresh and (conn := self._reuse()) is not None:
            return conn
        while self.open >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                raise
            if not fresh and (conn := self._reuse()) is not None:
                return conn
        self.open += 1
        try:
            return await self._connect()
        except BaseException:
            self.open -= 1
            self._wake()
            raise

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except TimeoutError:
            raise ConnectTimeout("connect timeout") from None
        except OSError as exc:
            raise ConnectFailed(type(exc).__name__) from None
        return conn

    def release(self, conn: _Conn) -> None:
        conn.waiter = None
        if conn.closed or not conn.keep_alive or self.closed:
            self.discard(conn)
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self.idle.append(conn)
        self._wake()
        if self.sweep is None:
            self.sweep = asyncio.get_running_loop().call_later(self.keepalive_s, self._sweep)

    def discard(self, conn: _Conn) -> None:
        conn.drop()
        self.open -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        """Close the connections idle for ``keepalive_s`` or more (the oldest are first)."""
        self.sweep = None
        now = asyncio.get_running_loop().time()
        idle = self.idle
        stale = 0
        while stale < len(idle) and (idle[stale].closed
                                     or now - idle[stale].idle_since >= self.keepalive_s):
            stale += 1
        for conn in idle[:stale]:
            conn.drop()
        del idle[:stale]
        self.open -= stale
        if stale:
            self._wake()
        if idle:
            delay = max(0.0, idle[0].idle_since + self.keepalive_s - now)
            self.sweep = asyncio.get_running_loop().call_later(delay, self._sweep)

    def close(self) -> None:
        self.closed = True
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep = None
        for conn in self.idle:
            conn.drop()
        self.open -= len(self.idle)
        self.idle.clear()


class LeanTransport(Transport):
    """``http://`` backends over ``_Conn`` pools (see the module docstring)."""

    def __init__(self, *, pool_size: int, connect_timeout_s: float,
                 keepalive_s: float = 60.0) -> None:
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._urls: dict[str, tuple[_Pool, bytes]] = {}
        """URL -> its pool and the request line's head up to the headers (a backend's few URLs
        are parsed once)."""
        self._closed = False

    def _target(self, url: str) -> tuple[_Pool, bytes]:
        scheme, sep, rest = url.partition("://")
        if scheme != "http" or not sep:
            raise TransportError(f"lean transport: not an http:// URL: {url!r}")
        authority, slash, path = rest.partition("/")
        path = slash + path if slash else "/"
        path = path.partition("#")[0]
        host, colon, port_text = authority.rpartition(":")
        if not colon or not port_text.isdigit() or "]" in port_text:
            host, port = authority, 80
        else:
            port = int(port_text)
        if "@" in host:
            raise TransportError("lean transport: credentials in URLs are not supported")
        connect_host = host[1:-1] if host.startswith("[") else host
        if not connect_host:
            raise TransportError(f"lean transport: no host in {url!r}")
        key = (connect_host, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(connect_host, port, limit=self._pool_size,
                                            keepalive_s=self._keepalive_s,
                                            connect_timeout_s=self._connect_timeout_s)
        if not path.isascii() or not path.isprintable() or " " in path:
            path = quote(path, safe=_PATH_SAFE)  # as aiohttp (yarl) sends it: UTF-8, %XX kept
        try:
            head = f" {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
        except UnicodeError:
            raise TransportError(f"lean transport: not an ASCII host in {url!r}") from None
        if len(self._urls) >= _URL_CACHE_MAX:
            self._urls.clear()
        target = self._urls[url] = (pool, head)
        return target

    @staticmethod
    def _payload(request: Request, head: bytes) -> bytes:
        lines = [request.method.encode("ascii"), head]
        has_length = False
        for name, value in request.headers.items():
            if name.lower() == "content-length":
                has_length = True
            lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        body = request.body
        if body is not None and not has_length:
            lines.append(b"Content-Length: %d\r\n" % len(body))
        elif body is None and request.method in ("POST", "PUT", "PATCH") and not has_length:
            lines.append(b"Content-Length: 0\r\n")
        lines.append(b"\r\n")
        if body:
            lines.append(body)
        return b"".join(lines)

    async def send(self, request: Request, *, timeout_s: float, bounded: bool = False) -> Reply:
        if self._closed:
            raise TransportError("lean transport: closed")
        target = self._urls.get(request.url) or self._target(request.url)
        if bounded:
            return await self._exchange(target, request)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._exchange(target, request)
        except TimeoutError:
            raise ReadTimeout("TimeoutError") from None

    async def _exchange(self, target: tuple[_Pool, bytes], request: Request) -> Reply:
        pool, head = target
        payload = self._payload(request, head)
        conn = await pool.acquire()
        try:
            return await self._once(pool, conn, payload)
        except _Stale:
            pass  # a kept-alive connection the server had closed: once more on a fresh one
        conn = await pool.acquire(fresh=True)
        try:
            return await self._once(pool, conn, payload)
        except _Stale:
            raise Reset("closed") from None

    @staticmethod
    async def _once(pool: _Pool, conn: _Conn, payload: bytes) -> Reply:
        if conn.closed:  # closed between the pool and here
            pool.discard(conn)
            if conn.reused:
                raise _Stale()
            raise Reset("closed")
        waiter = asyncio.get_running_loop().create_future()
        try:
            conn.start(payload, waiter)
            await waiter
        except BaseException:
            pool.discard(conn)  # cancelled, timed out or failed mid-exchange: never reused
            raise
        reply = Reply(conn.status, b"".join(conn.chunks),
                      CIMultiDictProxy(CIMultiDict(conn.headers)))
        conn.chunks = []
        conn.headers = []
        pool.release(conn)
        return reply

    async def close(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._urls.clear()

