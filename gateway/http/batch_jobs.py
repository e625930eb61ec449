"""Wiring: the batch routes, and per process a Redis client, the stores and a worker.

``register(app)`` (called by ``create_app``) adds the routes always, so they are documented and
answer even without Redis (503 naming the setting), and, when a Redis is configured and
``batch.enabled``, adds a lifetime to ``app.cleanup_ctx`` after the gateway's own, so the
worker starts once the pipeline exists and stops before it drains.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis
from aiohttp import web
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.batch.blobs import Blobs, DirBlobs, RedisBlobs
from gateway.batch.errors import BatchUnavailable
from gateway.batch.files import FileStore
from gateway.batch.finalize import Finalizer
from gateway.batch.gate import Gate, LoopLag
from gateway.batch.inputs import InputFiles
from gateway.batch.jobs import JobStore
from gateway.batch.keys import Keys
from gateway.batch.lines import LineRunner
from gateway.batch.worker import Worker
from gateway.http import app_state as state
from gateway.http.routes.batch import add as add_routes
from gateway.settings import Settings

NOT_CONFIGURED = ("batch jobs need Redis: set redis.url (GATEWAY_REDIS_URL) or batch.redis_url "
                  "(GATEWAY_BATCH_REDIS_URL)")
DISABLED = "batch jobs are turned off here (batch.enabled: false, GATEWAY_BATCH_ENABLED)"


@dataclass(frozen=True, slots=True)
class BatchService:
    """What the batch routes use: the stores over one Redis client."""

    files: FileStore
    jobs: JobStore


def redis_url(settings: Settings) -> str | None:
    """The Redis that batches use: ``batch.redis_url``, else the cache's (not a cluster)."""
    if settings.batch.redis_url:
        return settings.batch.redis_url
    if settings.redis.url and not settings.redis.is_cluster:
        return settings.redis.client_url
    return None


def service_of(request: web.Request) -> BatchService:
    """The batch service, or 503 saying what to configure."""
    found = request.app.get(state.BATCH)
    if found is None:
        settings = request.app[state.SETTINGS]
        raise BatchUnavailable(DISABLED if not settings.batch.enabled else NOT_CONFIGURED)
    return found


def register(app: web.Application) -> None:
    add_routes(app, service_of)
    settings = app[state.SETTINGS]
    url = redis_url(settings)
    if settings.batch.enabled and url:
        app.cleanup_ctx.append(lambda app: _lifetime(app, url))


async def _lifetime(app: web.Application, url: str) -> AsyncIterator[None]:
    settings = app[state.SETTINGS]
    batch = settings.batch
    # Generous timeouts: batch commands are not on the interactive path, and XREADGROUP blocks.
    # Retrying a command whose connection broke is safe here: every write is idempotent (HSETNX
    # results, SET/HSET by id, a queue entry run twice changes nothing).
    client = aioredis.Redis.from_url(
        url, socket_timeout=10.0, socket_connect_timeout=2.0, health_check_interval=15,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError])
    keys = Keys(settings.redis.key_prefix)
    blobs: Blobs = DirBlobs(batch.storage_dir) if batch.storage_dir else RedisBlobs(client, keys)
    files = FileStore(client, keys, blobs, batch)
    jobs = JobStore(client, keys, batch)
    app[state.BATCH] = BatchService(files=files, jobs=jobs)
    observer = app[state.OBSERVER]
    router = app[state.ROUTER]
    runner = LineRunner(app[state.PIPELINE], settings, model_width=router.model_width,
                        fragments=app[state.FRAGMENTS], quotas=app[state.QUOTAS],
                        observer=observer)
    lag = LoopLag()
    gate = Gate(app[state.ADMISSION], router, share=batch.share, concurrency=batch.concurrency,
                observer=observer, lag=lag)
    inputs = InputFiles(blobs)
    consumer = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    finalizer = Finalizer(jobs, files, inputs, observer, owner=consumer,
                          lock_ttl_s=batch.claim_idle_s * 2)
    worker = Worker(client, keys, jobs=jobs, runner=runner, gate=gate, lag=lag,
                    finalizer=finalizer, inputs=inputs, blobs=blobs, settings=batch,
                    observer=observer, consumer=consumer)
    worker.start()
    try:
        yield
    finally:
        await worker.stop()
        await client.aclose()
