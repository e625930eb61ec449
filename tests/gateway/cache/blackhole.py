"""A TCP peer that accepts, reads everything and never replies: a Redis that hangs."""

from __future__ import annotations

import asyncio

from tests.conftest import free_port


async def black_hole() -> tuple[asyncio.Server, int, list[asyncio.StreamWriter]]:
    """Start one on a free loopback port: ``(server, port, writers to close)``."""
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(65536):
            pass

    port = free_port()
    server = await asyncio.start_server(swallow, "127.0.0.1", port)
    return server, port, writers


async def close_black_hole(server: asyncio.Server, writers: list[asyncio.StreamWriter]) -> None:
    """Stop one started by ``black_hole`` and drop its connections."""
    for w in writers:
        w.close()
    server.close()
    await server.wait_closed()
