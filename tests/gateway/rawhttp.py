"""HTTP/1.1 over a raw asyncio stream, for tests that must control the bytes on the wire
(bodies split across segments, chunk framing, slow headers): the request head, chunks, and
reading one response back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

READ_TIMEOUT_S = 30.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        return orjson.loads(self.body)

    def error(self) -> dict[str, Any]:
        err: dict[str, Any] = self.json()["error"]
        return err


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """One HTTP/1.1 response with a Content-Length body (what aiohttp sends for web.Response)."""
    async with asyncio.timeout(READ_TIMEOUT_S):
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Reply(status, headers, body)


def head(path: str, port: int, *, length: int | None = None, chunked: bool = False,
         extra: str = "") -> bytes:
    """A POST request head with a JSON body framed by Content-Length or chunked encoding."""
    framing = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {length}\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\n{framing}{extra}\r\n").encode()


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"
