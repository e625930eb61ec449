"""A precise open-loop HTTP/1.1 load generator for loopback benchmarks of fast responses.

A generator on an event loop (aiohttp, as ``loadgen.run_closed``) errs by about a millisecond:
event-loop timers fire on a millisecond grid, and a response is timestamped only when the loop
gets round to reading it (after its other callbacks, on a core it shares with other processes).
That is the size of the figure the overload benchmark checks (a shed 503 in <= 2 ms), so this
generator removes both errors:

- **Sends on time.** One thread, no event loop: it waits on ``epoll`` while the next arrival is
  more than a millisecond away and ``time.sleep`` (a nanosleep) for the rest, then writes the
  pre-encoded request on an idle keep-alive connection (a new one when all are busy). ``lag`` is
  how late the write started against the schedule.
- **Timestamps from the kernel.** Each socket has ``SO_TIMESTAMPNS``: every received segment
  carries the time the kernel queued it, read with ``recvmsg``. A response's latency runs to the
  stamp of the segment that completed it, so the generator being busy (or asleep before the next
  send) when the bytes arrived does not count. Where the option is missing (not Linux), the
  receive time is read from the clock instead and ``Result.kernel_stamps`` is False.

Latency counts from the *scheduled* time, so a late send is included, as in wrk2. Bounded in
count, time (``max_duration_s`` for scheduling, then ``timeout_s`` at most for the answers) and
connections (``max_connections``; an arrival that finds none free is counted in ``shed`` and not
sent). Each connection carries one request at a time; responses must have a ``Content-Length``
(or be chunked). Samples are ``loadgen.Sample`` so reports treat both generators alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.loadgen import LoadResult, Sample

# Linux's SO_TIMESTAMPNS (== SCM_TIMESTAMPNS); the socket module does not export it.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_ANC_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) * 4
_RECV_BYTES = 1 << 18
_SPIN_NS = 1_500_000  # below this much time to the next send, sleep instead of waiting on epoll


@dataclass(frozen=True)
class Result(LoadResult):
    """A ``LoadResult`` plus how it was measured."""

    kernel_stamps: bool = True  # receive times from SO_TIMESTAMPNS (False: the clock at read)
    connections: int = 0  # connections opened over the run
    realtime: bool = False  # the generator ran at real-time priority (see ``run``)


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    index: int = -1  # request in flight on it; -1 when idle
    due_ns: int = 0
    sent_ns: int = 0
    buffer: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    body_start: int
    length: int | None  # None: chunked
    retry_after: bool
    close: bool  # the server said ``Connection: close``
    timing: dict[str, float] | None = None  # ``Server-Timing`` stages, ms (``t_<name>``)


def run(
    host: str,
    port: int,
    make: Callable[[int], bytes],
    *,
    rate_per_s: float,
    requests: int,
    max_duration_s: float,
    max_connections: int = 256,
    timeout_s: float = 10.0,
    warm_connections: int = 16,
    realtime: bool = False,
) -> Result:
    """Sends ``make(i)`` (a whole HTTP/1.1 request, keep-alive) at ``i / rate_per_s`` s.

    Samples are in index order; a 503 has ``info["retry_after"]`` 1.0 with a ``Retry-After``
    header (0.0 without it); an answer with ``Server-Timing`` has each stage's duration (ms)
    as ``info["t_<stage>"]``; other responses ``info is None``.
    """
    if not (rate_per_s > 0 and requests >= 0 and max_duration_s > 0 and timeout_s > 0
            and max_connections >= 1 and warm_connections >= 0):
        raise ValueError("rate, duration and timeout > 0, requests >= 0 and "
                         "max_connections >= 1 are required")
    gc_was = gc.isenabled()
    gc.disable()  # the generator's own pauses would show up as server latency
    policy = _realtime() if realtime else None
    try:
        result = _Run(host, port, make, rate_per_s, max_connections, timeout_s).go(
            requests, max_duration_s, min(warm_connections, max_connections))
        return dataclasses.replace(result, realtime=policy is not None)
    finally:
        if policy is not None:
            os.sched_setscheduler(0, *policy)
        if gc_was:
            gc.enable()


def _realtime() -> tuple[int, os.sched_param] | None:
    """Switches this thread to SCHED_FIFO priority 1 (it then runs as soon as its sleep ends,
    ahead of ordinary processes on its core); the old policy, or None when not allowed."""
    try:
        old = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (AttributeError, OSError):
        return None
    return old


def request_bytes(host: str, port: int, path: str, body: bytes,
                  headers: dict[str, str] | None = None) -> bytes:
    """A keep-alive ``POST path`` with a JSON ``body``, encoded once."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
             "Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Run:
    def __init__(self, host: str, port: int, make: Callable[[int], bytes], rate: float,
                 max_connections: int, timeout_s: float) -> None:
        self.address = (host, port)
        self.make = make
        self.interval_ns = 1e9 / rate
        self.max_connections = max_connections
        self.timeout_ns = int(timeout_s * 1e9)
        self.epoll = select.epoll()
        self.conns: dict[int, _Conn] = {}
        self.idle: list[_Conn] = []
        self.samples: list[Sample] = []
        self.stamped = True
        self.opened = 0
        self.start_ns = 0

    def go(self, requests: int, max_duration_s: float, warm: int) -> Result:
        try:
            for _ in range(warm):
                conn = self._open()
                if conn is None:
                    break
                self.idle.append(conn)
            return self._loop(requests, int(max_duration_s * 1e9))
        finally:
            for conn in list(self.conns.values()):
                self._close(conn)
            self.epoll.close()

    def _loop(self, requests: int, max_ns: int) -> Result:
        shed = 0
        index = 0
        stopped = False
        self.start_ns = start = time.time_ns()
        next_sweep = start
        while True:
            now = time.time_ns()
            while index < requests and not stopped:
                due = start + int(index * self.interval_ns)
                if due > now:
                    break
                if due - start >= max_ns:
                    stopped = True
                    break
                if not self._send(index, due):
                    shed += 1
                index += 1
            scheduling = index < requests and not stopped
            if not scheduling and not any(c.index >= 0 for c in self.conns.values()):
                break
            if now >= next_sweep:
                self._expire(now)
                next_sweep = now + 50_000_000
            wake = start + int(index * self.interval_ns) if scheduling else now + 50_000_000
            wait = wake - time.time_ns()
            for fd, _events in self.epoll.poll(max(wait - 1_000_000, 0) / 1e9
                                               if wait > _SPIN_NS else 0):
                self._readable(fd)
            rest = wake - time.time_ns()
            if scheduling and 0 < rest <= _SPIN_NS:
                time.sleep(rest / 1e9)
        self.samples.sort(key=lambda s: s.index)
        wall = (max((s.sent_s + s.latency_s - s.lag_s for s in self.samples), default=0.0))
        return Result("open", self.samples, wall, requests, shed,
                      "time" if stopped else "count", kernel_stamps=self.stamped,
                      connections=self.opened)

    def _send(self, index: int, due: int) -> bool:
        """Sends request ``index`` (False: no connection free, the arrival is shed)."""
        if self.idle:
            conn: _Conn | None = self.idle.pop()
        else:
            try:
                conn = self._open()
            except OSError as exc:  # refused, reset: a failed sample, not a crash
                now = time.time_ns()
                late = (now - due) / 1e9
                self.samples.append(Sample(index, (now - self.start_ns) / 1e9, late, late, 0,
                                           type(exc).__name__, None))
                return True
        if conn is None:
            return False
        data = self.make(index)
        conn.index, conn.due_ns, conn.sent_ns = index, due, time.time_ns()
        try:
            sent = conn.sock.send(data)
            if sent < len(data):  # rare on loopback: finish the write blocking
                conn.sock.setblocking(True)
                conn.sock.sendall(data[sent:])
                conn.sock.setblocking(False)
        except OSError as exc:
            self._fail(conn, type(exc).__name__, time.time_ns())
        return True

    def _open(self) -> _Conn | None:
        if len(self.conns) >= self.max_connections:
            return None
        sock = socket.create_connection(self.address, timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            self.stamped = False
        sock.setblocking(False)
        conn = _Conn(sock)
        self.conns[sock.fileno()] = conn
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        self.opened += 1
        return conn

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            with contextlib.suppress(OSError):
                self.epoll.unregister(fd)
            self.conns.pop(fd, None)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        conn.sock.close()

    def _readable(self, fd: int) -> None:
        conn = self.conns.get(fd)
        if conn is None:
            return
        try:
            data, ancillary, _flags, _addr = conn.sock.recvmsg(_RECV_BYTES, _ANC_SPACE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(conn, type(exc).__name__, time.time_ns())
            return
        stamp = time.time_ns()
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                stamp = sec * 1_000_000_000 + nsec
        if not data:
            self._fail(conn, "ConnectionClosed", stamp)
            return
        if conn.index < 0:
            self._fail(conn, "UnexpectedData", stamp)
            return
        conn.buffer += data
        head = _parse_head(conn.buffer)
        if head is None or not _complete(conn.buffer, head):
            return
        self._record(conn, head.status, None, stamp, head.retry_after, head.timing)
        conn.index = -1
        conn.buffer.clear()
        if head.close:
            self._close(conn)  # the next request goes on a new connection
        else:
            self.idle.append(conn)

    def _expire(self, now: int) -> None:
        for conn in list(self.conns.values()):
            if conn.index >= 0 and now - conn.due_ns > self.timeout_ns:
                self._fail(conn, "TimeoutError", now)

    def _fail(self, conn: _Conn, error: str, stamp: int) -> None:
        if conn.index >= 0:
            self._record(conn, 0, error, stamp, False)
        self._close(conn)

    def _record(self, conn: _Conn, status: int, error: str | None, stamp: int,
                retry_after: bool, timing: dict[str, float] | None = None) -> None:
        info = timing or None  # a dict of its own per answer (``_parse_head``)
        if status == 503:
            info = {**(info or {}), "retry_after": float(retry_after)}
        self.samples.append(Sample(
            conn.index, (conn.sent_ns - self.start_ns) / 1e9, (stamp - conn.due_ns) / 1e9,
            (conn.sent_ns - conn.due_ns) / 1e9, status, error, info))
        conn.index = -1


def _parse_head(buffer: bytearray) -> _Head | None:
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length: int | None = 0
    retry_after = close = False
    timing: dict[str, float] | None = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "transfer-encoding" and "chunked" in value.lower():
            length = None
        elif name == "retry-after":
            retry_after = True
        elif name == "connection" and value.strip().lower() == "close":
            close = True
        elif name == "server-timing":
            timing = server_timing(value)
    return _Head(status, end + 4, length, retry_after, close, timing)


def server_timing(value: str) -> dict[str, float]:
    """``Server-Timing: queue;dur=1.2, compute;dur=3.4`` -> ``{"t_queue": 1.2, ...}`` (ms);
    entries without a readable ``dur`` are left out."""
    found: dict[str, float] = {}
    for entry in value.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, number = param.strip().partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):
                    found["t_" + name.strip()] = float(number)
    return found


def _complete(buffer: bytearray, head: _Head) -> bool:
    if head.length is None:
        return buffer.endswith(b"0\r\n\r\n") and len(buffer) > head.body_start
    return len(buffer) - head.body_start >= head.length


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m bench.openloop URL RATE
    from urllib.parse import urlsplit

    target = urlsplit(sys.argv[1])
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
    host_, port_ = target.hostname or "127.0.0.1", target.port or 80
    payload = request_bytes(host_, port_, target.path or "/", b"{}")
    result = run(host_, port_, lambda _i: payload, rate_per_s=rate, requests=int(rate * 3),
                 max_duration_s=3.0)
    print(result.status_counts(), f"p99 {result.latency_ms(99):.3f} ms",
          f"kernel stamps: {result.kernel_stamps}")
