"""``stop_task``: how every long-lived background loop of the gateway stops (policy and tenants
file watchers, health checks, the access log and metric flushers)."""

from __future__ import annotations

import asyncio
import contextlib


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait until it has ended; its cancellation is
    not re-raised, any other exception it ended with is."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
