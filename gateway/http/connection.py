"""Per-connection read deadlines and the connection cap, enforced in aiohttp's protocol.

aiohttp's ``RequestHandler`` (one per connection, an ``asyncio.Protocol``) parses bytes as
they arrive in ``data_received`` and queues each complete request head with its body stream.
It has no deadline for the head at all (its keep-alive timer is the only bound, and only while
the connection is otherwise idle), and none for a body that trickles in. ``GuardedRequestHandler``
adds, from ``ConnectionSettings``:

- a head deadline: armed by the first byte of a request head, disarmed when the head is
  complete; past it, 408 in the gateway's JSON error shape (when no response is being written
  on the connection) and the connection closes;
- a body deadline: armed when a head with a body is complete, disarmed when the body is; past
  it the body stream fails with ``BodyTimeout``, which the handler reading it turns into a 408
  through the error middleware, and the connection closes after that answer;
- a cap on open connections per worker: one more is answered 503 with ``Retry-After`` and
  closed before anything is read;
- the time each request's head was read (``ARRIVED`` on the request): its deadline counts from
  then. Under a burst the loop reads every connection's bytes in one turn, then runs their
  handlers one after another, so the last handler starts tens or hundreds of milliseconds after
  its head came (300 long texts at once: ~150 ms); a deadline counted from the handler let the
  gateway answer in time by its clock and late by the client's. The loop itself reads a head
  late when it was busy: the bytes wait in the socket. For a head that carries its own
  deadline (``X-Request-Timeout-Ms``), the kernel says how long: TCP_INFO's
  ``tcpi_last_data_recv`` (milliseconds since the newest segment came, in kernel ticks), and
  the stamp moves back by that wait once it is two ticks or more. One ``getsockopt`` (~1 us),
  only for such heads; the stamp is never earlier than the newest segment's arrival.

Timers are loop ``call_at`` handles, so a slow client costs no task and delays nobody else.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import istr

from gateway.errors import GatewayError, Overloaded, RequestTimeout
from gateway.http.middleware import ARRIVED, SERVER_NAME, new_request_id

log = logging.getLogger("gateway.http")

_DEADLINE_HEADER = istr("X-Request-Timeout-Ms")  # istr: looked up without folding
# struct tcp_info (linux/tcp.h): tcpi_last_data_recv, a u32 of milliseconds at byte 52.
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_AT = 52
_TCP_INFO_LEN = 56
# Below this the reading is the kernel tick's rounding (4 ms at 250 Hz), not a wait.
_MIN_SOCKET_WAIT_S = 0.008


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What ``GuardedRequestHandler`` enforces (from ``ConnectionSettings``)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024


class BodyTimeout(RequestTimeout, TimeoutError):
    """The body did not arrive in time. A ``TimeoutError`` too: aiohttp's lingering read of an
    unread body stops quietly on one, and the error middleware answers the 408 for a handler
    that was reading."""


class HeadGate(Protocol):
    """What judges a complete request from its parsed head before aiohttp builds a request
    (http/gate.py ``ReadGate``)."""

    @property
    def armed(self) -> bool:
        """Whether anything may be refused now (else no request is judged)."""

    def judge(self, message: RawRequestMessage, arrived: float) -> tuple[bytes, float] | None:
        """The whole response refusing ``message`` and how long to hold it; None: the app
        answers it."""


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol with a head deadline, a body deadline, a cap, and a gate
    that may refuse a request from its head (``HeadGate``)."""

    __slots__ = ("_arrivals", "_body", "_body_timer", "_gate", "_head_timer", "_held",
                 "_held_data", "_limits", "_sock")

    def __init__(self, manager: Any, *, limits: ConnectionLimits | None = None,
                 gate: HeadGate | None = None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits or ConnectionLimits()
        self._gate = gate
        self._held: asyncio.TimerHandle | None = None  # a refusal waiting out its hold
        self._held_data: list[bytes] = []  # bytes read while it waits (reading is paused)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        self._sock: Any = None  # the TCP socket (TCP_INFO), None for any other transport
        # When each head still queued for the handler loop was read, in the queue's order
        # (aiohttp's ``_messages``): ``start`` makes their requests one by one, in that order.
        arrivals = self._arrivals = deque[float]()
        factory = self._request_factory
        if factory is not None:
            def stamped(*args: Any) -> web.BaseRequest:
                request = factory(*args)
                if arrivals:
                    request[ARRIVED] = arrivals.popleft()
                return request
            self._request_factory = stamped

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if (_TCP_INFO is not None and sock is not None
                and sock.family in (socket.AF_INET, socket.AF_INET6)):
            self._sock = sock
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            log.warning("connection refused: cap reached",
                        extra={"max_connections": self._limits.max_connections})
            self._answer_and_close(Overloaded(
                f"this worker has {self._limits.max_connections} open connections; "
                "retry shortly", reason="connections"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            super().data_received(data)
            return
        if self._held is not None:  # answered in order: after the held refusal
            self._held_data.append(data)
            return
        # An idle connection (its handler loop waiting for a request) while the gate is armed:
        # aiohttp must not wake the loop for a request the gate answers, so the waiter is out
        # of its sight while it parses, and woken below if a request is left for the app.
        waiter = self._waiter
        gate = self._gate
        gated = (gate is not None and waiter is not None and not self._messages
                 and not waiter.done() and gate.armed)
        if gated:
            self._waiter = None
        try:
            self._read(data)
        finally:
            if gated:
                self._waiter = waiter
        if gated:
            assert gate is not None and waiter is not None
            if len(self._messages) == 1:
                self._judge(gate)
            if self._messages and not waiter.done():
                waiter.set_result(None)

    def _judge(self, gate: HeadGate) -> None:
        """Answer the one queued request here if ``gate`` refuses it: complete (its body read),
        keep-alive HTTP/1.1, nothing else waiting or being answered on the connection."""
        message, payload = self._messages[0]
        if (not isinstance(message, RawRequestMessage) or not payload.is_eof()
                or message.should_close or message.version != HttpVersion11
                or message.upgrade or not self._arrivals):
            return
        try:
            verdict = gate.judge(message, self._arrivals[0])
        except Exception:  # a defect in judging must not cost the request: the app answers
            log.exception("the read gate failed; the request takes the full path")
            return
        if verdict is None:
            return
        self._messages.popleft()
        self._arrivals.popleft()
        if self._parser is not None:
            self._parser.message_consumed()
        self._cancel_body()
        self._body = None
        answer, hold_s = verdict
        # An idle keep-alive connection stays open for keepalive_timeout from this answer
        # (written after the hold).
        self._keepalive = True
        if self._keepalive_timeout > 0:
            self._next_keepalive_close_time = (self._loop.time() + max(0.0, hold_s)
                                               + self._keepalive_timeout)
            if self._keepalive_handle is None:
                self._keepalive_handle = self._loop.call_at(self._next_keepalive_close_time,
                                                            self._process_keepalive)
        transport = self.transport
        if transport is None:
            return
        if hold_s <= 0:
            transport.write(answer)
            return
        transport.pause_reading()
        self._held = self._loop.call_later(hold_s, self._release, answer)

    def _release(self, answer: bytes) -> None:
        """The hold is over: write the refusal, then go on with what was read meanwhile."""
        self._held = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        transport.resume_reading()
        if self._held_data:
            data = b"".join(self._held_data)
            self._held_data.clear()
            self.data_received(data)

    def _read(self, data: bytes) -> None:
        """aiohttp's parse, with the heads' arrival stamps and the read deadlines."""
        in_body = self._body is not None and not self._body.is_eof()
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # one or more heads completed
            now = time.monotonic()
            added = self._request_count - count
            if self._sock is not None and self._carries_deadline(added):
                now -= self._socket_wait()
            if added == 1:
                self._arrivals.append(now)
            else:
                self._arrivals.extend([now] * added)
            if self._head_timer is not None:  # (``_cancel_head``, inline: every request)
                self._head_timer.cancel()
                self._head_timer = None
            last = self._messages[-1][1] if self._messages else None
            body = self._body = last if isinstance(last, StreamReader) else None
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            if body is not None and not body.is_eof():
                self._body_timer = self._loop.call_later(self._limits.body_timeout_s,
                                                         self._body_expired, body)
        elif in_body:
            if self._body is not None and self._body.is_eof():
                self._cancel_body()
        elif self._head_timer is None:  # the first bytes of a head
            self._head_timer = self._loop.call_later(self._limits.header_timeout_s,
                                                     self._head_expired)

    def _carries_deadline(self, added: int) -> bool:
        """Whether one of the ``added`` heads just read has its own deadline."""
        for message, _ in itertools.islice(reversed(self._messages), added):
            headers = getattr(message, "headers", None)  # a parse error has none
            if headers is not None and _DEADLINE_HEADER in headers:
                return True
        return False

    def _socket_wait(self) -> float:
        """Seconds the newest bytes waited in the socket before this read (0 below two kernel
        ticks, or when the kernel does not say)."""
        try:
            raw = self._sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_LEN)
            (waited_ms,) = _LAST_DATA_RECV.unpack_from(raw, _LAST_DATA_RECV_AT)
        except (OSError, struct.error):
            return 0.0
        waited = waited_ms / 1000.0
        return waited if waited >= _MIN_SOCKET_WAIT_S else 0.0

    def _process_keepalive(self) -> None:
        # aiohttp's idle timer also fires while a head trickles in (it only sees "no request
        # yet") and would close without an answer: the head deadline decides then.
        if self._head_timer is not None:
            self._keepalive_handle = None
            return
        super()._process_keepalive()

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._force_close or self.transport is None:
            return
        log.info("request head not received in time",
                 extra={"header_timeout_s": self._limits.header_timeout_s})
        idle = self._waiter is not None and not self._waiter.done()
        if idle:  # nothing being answered: the 408 cannot interleave with a response
            self._answer_and_close(RequestTimeout(
                f"the request head did not arrive within {self._limits.header_timeout_s:g} s"))
        else:
            self.force_close()

    def _body_expired(self, body: StreamReader) -> None:
        self._body_timer = None
        if body.is_eof() or self.transport is None:
            return
        log.info("request body not received in time",
                 extra={"body_timeout_s": self._limits.body_timeout_s})
        self.close()  # after the 408 (or the handler's answer) the connection is done
        body.set_exception(BodyTimeout(
            f"the request body did not arrive within {self._limits.body_timeout_s:g} s"))

    def _answer_and_close(self, error: GatewayError) -> None:
        """Write ``error`` straight to the transport and close it (no request to answer)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(raw_error(error, new_request_id()))
        self.force_close()

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _disarm(self) -> None:
        self._cancel_head()
        self._cancel_body()
        if self._held is not None:
            self._held.cancel()
            self._held = None
        self._held_data.clear()


_REASONS = {408: "Request Timeout", 503: "Service Unavailable", 504: "Gateway Timeout"}


def raw_error(error: GatewayError, request_id: str, *, close: bool = True) -> bytes:
    """A complete HTTP/1.1 response in the gateway's error shape (ending the connection unless
    ``close`` is false)."""
    body = orjson.dumps({"error": {"type": error.type, "message": error.public_message,
                                   "request_id": request_id}})
    lines = [f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}",
             "Content-Type: application/json", f"Content-Length: {len(body)}",
             *(("Connection: close",) if close else ()), f"X-Request-Id: {request_id}",
             f"Server: {SERVER_NAME}", *(f"{k}: {v}" for k, v in error.headers().items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body
