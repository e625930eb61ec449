"""``LeanTransport`` (gateway/upstream/lean.py) against a real aiohttp server, and against a raw
socket server for what aiohttp will not do on demand: chunked by hand, a kept-alive connection
closed under the client, a close mid-body, a body that stalls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.upstream.lean import LeanTransport
from gateway.upstream.transport import (
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    Request,
    Reset,
    TransportError,
)
from tests.conftest import free_port

# --- a real aiohttp server ---


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[Any]]]:
    """An aiohttp server on loopback; the second item lists the peer of every request (one
    entry per request, so distinct peers are distinct connections)."""
    peers: list[Any] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.read()
        resp = web.Response(body=body, status=201,
                            headers={"X-Method": request.method,
                                     "X-Got-Type": request.headers.get("Content-Type", "")})
        resp.headers.add("X-Twice", "a")
        resp.headers.add("X-Twice", "b")
        return resp

    async def big(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(body=bytes(range(256)) * (4 * 4096))  # 4 MiB

    async def chunked(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(50):
            await resp.write(b"part%d;" % i)
        await resp.write_eof()
        return resp

    async def closing(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(body=b"bye", headers={"Connection": "close"})

    async def raw_path(request: web.Request) -> web.Response:
        return web.Response(text=request.raw_path)

    app = web.Application(client_max_size=8 << 20)
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/big", big)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/closing", closing)
    app.router.add_get("/raw/{tail:.*}", raw_path)
    srv = TestServer(app, host="127.0.0.1", port=free_port())
    await srv.start_server()
    yield f"http://127.0.0.1:{srv.port}", peers
    await srv.close()


@pytest.fixture
async def lean() -> AsyncIterator[LeanTransport]:
    transport = LeanTransport(pool_size=4, connect_timeout_s=1.0)
    yield transport
    await transport.close()


async def test_post_and_get_over_one_kept_alive_connection(
        server: tuple[str, list[Any]], lean: LeanTransport) -> None:
    url, peers = server
    for i in range(3):
        reply = await lean.send(Request("POST", url + "/echo", b"body %d" % i,
                                        {"Content-Type": "application/json"}), timeout_s=5)
        assert (reply.status, reply.body) == (201, b"body %d" % i)
        assert reply.headers["x-method"] == "POST"
        assert reply.headers["X-Got-Type"] == "application/json"
    reply = await lean.send(Request("GET", url + "/echo"), timeout_s=5, bounded=True)
    assert (reply.status, reply.body, reply.headers["X-Method"]) == (201, b"", "GET")
    assert len(peers) == 4 and len(set(peers)) == 1


async def test_repeated_headers_are_all_kept(server: tuple[str, list[Any]],
                                             lean: LeanTransport) -> None:
    url, _ = server
    reply = await lean.send(Request("POST", url + "/echo", b"x"), timeout_s=5)
    assert reply.headers.getall("X-Twice") == ["a", "b"]  # type: ignore[attr-defined]


async def test_large_and_chunked_bodies(server: tuple[str, list[Any]],
                                        lean: LeanTransport) -> None:
    url, peers = server
    reply = await lean.send(Request("GET", url + "/big"), timeout_s=10)
    assert reply.body == bytes(range(256)) * (4 * 4096)
    reply = await lean.send(Request("GET", url + "/chunked"), timeout_s=5)
    assert reply.body == b"".join(b"part%d;" % i for i in range(50))
    assert "Content-Length" not in reply.headers
    big = bytes(range(256)) * 8192  # a 2 MiB request body
    reply = await lean.send(Request("POST", url + "/echo", big), timeout_s=10)
    assert reply.body == big
    assert len(set(peers)) == 1


async def test_connection_close_answer_is_not_reused(server: tuple[str, list[Any]],
                                                     lean: LeanTransport) -> None:
    url, peers = server
    for _ in range(2):
        reply = await lean.send(Request("GET", url + "/closing"), timeout_s=5)
        assert reply.body == b"bye"
    assert len(set(peers)) == 2


async def test_a_non_ascii_path_goes_as_aiohttp_sends_it(server: tuple[str, list[Any]],
                                                        lean: LeanTransport) -> None:
    """A path the gateway got from a client (percent-decoded, any text) is percent-encoded
    from UTF-8, existing escapes kept: the bytes aiohttp's client puts on the wire."""
    url, _ = server
    for path in ("/raw/v/\u009f\u00e6 x%2F?q=\u00fc", "/raw/plain/1?a=b&c=d"):
        reply = await lean.send(Request("GET", url + path), timeout_s=5)
        async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
            assert reply.body.decode() == await resp.text()


async def test_connect_refused_is_connect_failed(lean: LeanTransport) -> None:
    with pytest.raises(ConnectFailed):
        await lean.send(Request("GET", f"http://127.0.0.1:{free_port()}/x"), timeout_s=5)


async def test_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def never(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(loop, "create_connection", never)
    transport = LeanTransport(pool_size=1, connect_timeout_s=0.01)
    with pytest.raises(ConnectTimeout):
        await transport.send(Request("GET", "http://127.0.0.1:9/x"), timeout_s=30)
    await transport.close()


async def test_not_http_is_a_transport_error(lean: LeanTransport) -> None:
    with pytest.raises(TransportError):
        await lean.send(Request("GET", "https://127.0.0.1:1/x"), timeout_s=1)


# --- a raw socket server: the test writes every byte of every answer ---

Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Raw:
    """A TCP server on loopback running ``script(connection_number, reader, writer)``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests = 0
        self.eofs = 0
        self.eof = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Raw:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/p"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(self.connections, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bool:
        """One request (False at EOF)."""
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return False
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        self.requests += 1
        return True

    async def until_eof(self, reader: asyncio.StreamReader) -> None:
        await reader.read()
        self.eofs += 1
        self.eof.set()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_raw_chunked_with_extensions_and_trailers() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")
        await writer.drain()
        await raw.read_request(reader)
        writer.write(OK)
        await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"hello world"
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"ok"
        assert raw.connections == 1
        await lean.close()


async def test_stale_keep_alive_is_sent_again_once_on_a_fresh_connection() -> None:
    """The server answers once, then closes that connection on the next request without a byte:
    the client sends the request again on a new connection."""
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader):
            if n == 1 and raw.requests > 1:
                return  # closed: nothing of the answer written
            writer.write(OK)
            await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=2, connect_timeout_s=1.0)
        assert (await lean.send(Request("POST", raw.url, b"a"), timeout_s=5)).body == b"ok"
        assert (await lean.send(Request("POST", raw.url, b"b"), timeout_s=5)).body == b"ok"
        assert (raw.connections, raw.requests) == (2, 3)
        await lean.close()


async def test_fresh_connection_closed_without_an_answer_is_reset_not_resent() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=2, connect_timeout_s=1.0)
        with pytest.raises(Reset):
            await lean.send(Request("POST", raw.url, b"a"), timeout_s=5)
        assert (raw.connections, raw.requests) == (1, 1)
        await lean.close()


async def test_stale_twice_is_reset() -> None:
    """A reused connection and then the fresh one both close without a byte: one resend only."""
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        if n == 1:
            writer.write(OK)
            await writer.drain()
            await raw.read_request(reader)

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=2, connect_timeout_s=1.0)
        await lean.send(Request("POST", raw.url, b"a"), timeout_s=5)
        with pytest.raises(Reset):
            await lean.send(Request("POST", raw.url, b"b"), timeout_s=5)
        assert (raw.connections, raw.requests) == (2, 3)
        await lean.close()


async def test_close_mid_body_is_reset_and_not_resent() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader):
            if raw.requests == 1:
                writer.write(OK)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
                await writer.drain()
                return
            await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=2, connect_timeout_s=1.0)
        await lean.send(Request("GET", raw.url), timeout_s=5)
        with pytest.raises(Reset):
            await lean.send(Request("GET", raw.url), timeout_s=5)  # reused, but bytes came
        assert (raw.connections, raw.requests) == (1, 2)
        await lean.close()


async def test_bad_answer_is_reset() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await raw.until_eof(reader)

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        with pytest.raises(Reset):
            await lean.send(Request("GET", raw.url), timeout_s=5)
        await asyncio.wait_for(raw.eof.wait(), 5)  # the client dropped the connection
        await lean.close()


async def _stalling(raw_box: list[Raw]) -> Script:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = raw_box[0]
        while await raw.read_request(reader):
            if raw.requests == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nslow")
                await writer.drain()
                await raw.until_eof(reader)  # the rest never comes
                return
            writer.write(OK)
            await writer.drain()
    return script


async def test_slow_body_is_read_timeout_and_the_connection_dropped() -> None:
    box: list[Raw] = []
    async with Raw(await _stalling(box)) as raw:
        box.append(raw)
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        with pytest.raises(ReadTimeout):
            await lean.send(Request("GET", raw.url), timeout_s=0.05)
        await asyncio.wait_for(raw.eof.wait(), 5)
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"ok"
        assert raw.connections == 2
        await lean.close()


async def test_bounded_call_cut_by_the_callers_timeout_drops_the_connection() -> None:
    box: list[Raw] = []
    async with Raw(await _stalling(box)) as raw:
        box.append(raw)
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await lean.send(Request("GET", raw.url), timeout_s=0.05, bounded=True)
        await asyncio.wait_for(raw.eof.wait(), 5)
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"ok"
        assert raw.connections == 2  # pool_size 1: the dropped one no longer counts
        await lean.close()


async def test_cancelled_mid_request_never_returns_the_connection() -> None:
    asked = asyncio.Event()

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader):
            if n == 1:
                asked.set()
                await raw.until_eof(reader)
                return
            writer.write(OK)
            await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        task = asyncio.create_task(lean.send(Request("GET", raw.url), timeout_s=30))
        await asyncio.wait_for(asked.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(raw.eof.wait(), 5)
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"ok"
        assert raw.connections == 2
        await lean.close()


async def test_pool_is_bounded_and_waiters_get_the_connection() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader):
            writer.write(OK)
            await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        replies = await asyncio.gather(*(lean.send(Request("GET", raw.url), timeout_s=5)
                                         for _ in range(5)))
        assert [r.body for r in replies] == [b"ok"] * 5
        assert (raw.connections, raw.requests) == (1, 5)
        await lean.close()


async def test_idle_connection_is_closed_after_keepalive() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        writer.write(OK)
        await writer.drain()
        await raw.until_eof(reader)

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0, keepalive_s=0.01)
        await lean.send(Request("GET", raw.url), timeout_s=5)
        await asyncio.wait_for(raw.eof.wait(), 5)  # the client closed the idle connection
        assert raw.eofs == 1
        await lean.close()


async def test_idle_connection_closed_by_the_server_is_not_used() -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 1:
            closed.set()
            return
        await raw.read_request(reader)

    closed = asyncio.Event()
    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        await lean.send(Request("GET", raw.url), timeout_s=5)
        await asyncio.wait_for(closed.wait(), 5)
        for _ in range(100):  # until the client has seen the close (bounded)
            pool = next(iter(lean._pools.values()))
            if pool.idle and pool.idle[-1].closed:
                break
            await asyncio.sleep(0.01)
        assert (await lean.send(Request("GET", raw.url), timeout_s=5)).body == b"ok"
        assert (raw.connections, raw.requests) == (2, 2)
        await lean.close()


async def test_lifo_reuse() -> None:
    """Two connections idle: the one released last carries the next request."""
    gate = asyncio.Event()
    seen: list[int] = []

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader):
            seen.append(n)
            if n == 1 and len(seen) <= 2:
                await gate.wait()  # connection 1 answers after connection 2
            writer.write(OK)
            await writer.drain()

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=2, connect_timeout_s=1.0)
        first = asyncio.create_task(lean.send(Request("GET", raw.url), timeout_s=5))
        for _ in range(100):
            if raw.connections == 1 and seen:
                break
            await asyncio.sleep(0.01)
        await lean.send(Request("GET", raw.url), timeout_s=5)  # on connection 2
        gate.set()
        await first  # connection 1 back last
        await lean.send(Request("GET", raw.url), timeout_s=5)
        assert seen == [1, 2, 1]
        await lean.close()


def test_under_uvloop() -> None:
    """The gateway's loop is uvloop, whose transports are not ``asyncio.Transport``s."""
    import uvloop

    async def main() -> bytes:
        async def script(n: int, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
            while await raw.read_request(reader):
                writer.write(OK)
                await writer.drain()

        async with Raw(script) as raw:
            lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
            try:
                await lean.send(Request("GET", raw.url), timeout_s=5)
                return (await lean.send(Request("GET", raw.url), timeout_s=5)).body
            finally:
                await lean.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == b"ok"


async def test_a_connection_busy_at_close_is_closed_when_it_comes_back() -> None:
    asked = asyncio.Event()
    answer = asyncio.Event()

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        asked.set()
        await answer.wait()
        writer.write(OK)
        await writer.drain()
        await raw.until_eof(reader)

    async with Raw(script) as raw:
        lean = LeanTransport(pool_size=1, connect_timeout_s=1.0)
        task = asyncio.create_task(lean.send(Request("GET", raw.url), timeout_s=5))
        await asyncio.wait_for(asked.wait(), 5)
        await lean.close()
        answer.set()
        assert (await task).body == b"ok"
        await asyncio.wait_for(raw.eof.wait(), 5)  # closed by the client, not kept


def test_http_client_setting_is_checked() -> None:
    from gateway.routing import RoutingSettings
    from gateway.validation import SettingsError

    assert RoutingSettings(http_client="lean").http_client == "lean"
    with pytest.raises(SettingsError, match="http_client"):
        RoutingSettings(http_client="curl")


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text((Path(__file__).resolve().parents[3] / "policies" / "default.yaml")
                      .read_text())
    return policy


async def test_the_app_sends_http_through_the_lean_client_when_set(
        tmp_path: Path, policy_file: Path) -> None:
    from prometheus_client import CollectorRegistry

    from gateway.app import create_app
    from gateway.http import app_state as state
    from gateway.settings import load_settings
    from gateway.upstream.transport import AiohttpTransport, SchemeTransport

    values = {"backends": ["http://127.0.0.1:9"], "policies.path": str(policy_file),
              "cache.node.path": str(tmp_path / "node"), "routing.http_client": "lean"}
    app = create_app(load_settings(None, values, environ={}), registry=CollectorRegistry())
    server = TestServer(app)
    await server.start_server()
    try:
        transport = app[state.TRANSPORT]
        assert isinstance(transport, SchemeTransport)
        assert isinstance(transport.by_scheme["http"], LeanTransport)
        assert isinstance(transport.by_scheme["https"], AiohttpTransport)
    finally:
        await server.close()
