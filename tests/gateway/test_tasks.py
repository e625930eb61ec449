"""``stop_task``: the one way the gateway's background loops stop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tasks import stop_task


async def test_a_running_loop_is_cancelled_and_awaited() -> None:
    ended = asyncio.Event()

    async def loop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await stop_task(task)
    assert task.cancelled() and ended.is_set()
    await stop_task(None)  # nothing started: nothing to do


async def test_a_loop_that_failed_reraises_its_error() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await stop_task(task)
