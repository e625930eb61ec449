"""Process model: one worker in-process, or a supervisor with N workers sharing the port.

Workers bind the same port with SO_REUSEPORT and the kernel spreads connections between them.
Prometheus metrics are shared through prometheus-client's multiprocess mode: the supervisor makes a
fresh ``PROMETHEUS_MULTIPROC_DIR`` before any worker starts, so ``/metrics`` on any worker reports
all of them. SIGTERM/SIGINT stop every worker; SIGHUP is forwarded (policy reload).

Each worker serves the app through ``GatewayRunner``, whose connections answer what fails before
any middleware runs (a request line or header too long, a message that is not HTTP) in the
gateway's JSON error shape, and log the status and the kind of error, never the bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    HeadersTooLarge,
    MalformedRequest,
    UriTooLong,
)
from gateway.http import app_state as state
from gateway.http.connection import ConnectionLimits, GuardedRequestHandler, HeadGate
from gateway.http.gate import ReadGate
from gateway.http.middleware import error_response, new_request_id
from gateway.policy.loader import PolicyError
from gateway.settings import Settings, SettingsError, load_settings, settings_fields
from gateway.telemetry.logs import setup_logging
from oip.parse_errors import parse_failure

log = logging.getLogger("gateway.server")
http_log = logging.getLogger("gateway.http")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave: each flag's ``dest`` is a setting's dotted path
    (``--redis`` -> ``redis.url``); flags not given are None and left out."""
    paths = {s.path for s in settings_fields()}
    return {k: v for k, v in vars(args).items() if k in paths and v is not None}


def serve(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config, flag_overrides(args))
        settings.require_backends()
    except SettingsError as exc:
        print(f"gateway: invalid settings: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.logging.level)
    workers = settings.workers or (os.cpu_count() or 1)
    if workers == 1:
        return run_worker(settings, reuse_port=False)
    return supervise(settings, workers)


def run_worker(settings: Settings, *, reuse_port: bool, policy_share: str | None = None) -> int:
    """Run one gateway process until SIGTERM/SIGINT (``policy_share``: see ``supervise``)."""
    from gateway.app import create_app

    setup_logging(settings.logging.level)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # uvloop is optional off Linux/macOS
        pass
    try:
        app = create_app(settings, handle_signals=True,
                         policy_share=Path(policy_share) if policy_share else None)
    except (SettingsError, ValueError, OSError, PolicyError) as exc:
        print(f"gateway: cannot start: {exc}", file=sys.stderr)
        return 2
    app.on_startup.append(_freeze_gc)
    log.info("gateway listening", extra={"host": settings.host, "port": settings.port,
                                          "pid": os.getpid()})
    asyncio.run(_serve(app, settings, reuse_port=reuse_port))
    return 0


async def _serve(app: web.Application, settings: Settings, *, reuse_port: bool) -> None:
    """``web.run_app``'s job (which cannot take another runner) with ``GatewayRunner``."""
    # keepalive_timeout: an idle connection's life (the handler's own default is an hour).
    runner = GatewayRunner(app, access_log=None, shutdown_timeout=10.0,
                           keepalive_timeout=settings.connections.keepalive_timeout_s)
    try:
        # Inside the try: a start that fails half-way still runs the exits of the cleanup
        # contexts that did start (gateway/app.py keeps one per resource).
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port,
                           backlog=settings.connections.backlog)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


_PARSE_ERRORS: dict[int, type[GatewayError]] = {
    414: UriTooLong, 431: HeadersTooLarge, 400: MalformedRequest}


class GatewayRequestHandler(GuardedRequestHandler):
    """aiohttp's per-connection protocol, with its error answers in the gateway's shape (and
    the read deadlines and connection cap of ``GuardedRequestHandler``).

    aiohttp calls ``handle_error`` for what fails before the app (and so before any middleware)
    sees a request: a request line, header or header count over the parser's limits, a message
    that is not HTTP/1.1, or an exception escaping the app. Its own version answers in plain
    text, names ``Server: Python/... aiohttp/...`` and logs the first 100 bytes of the offending
    line at ERROR (an API key, a token in a query string). This one answers
    ``{"error": {"type", "message", "request_id"}}`` with 414, 431 or 400 and logs one line with
    the status and the kind of error. Overriding this documented hook needs a request handler
    class, which aiohttp takes from no setting: ``GatewayServer`` makes it.
    """

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        rid = new_request_id()
        error: GatewayError
        if isinstance(exc, HttpProcessingError):
            failure = parse_failure(exc, max_line_size=self.max_line_size,
                                    max_field_size=self.max_field_size,
                                    max_headers=self.max_headers,
                                    first_request=self._request_count == 1)
            error = _PARSE_ERRORS[failure.status](failure.message)
            # Scanners send TLS or junk as a first request: aiohttp keeps those at DEBUG too.
            http_log.log(logging.DEBUG if failure.quiet else logging.INFO, "unparsable request",
                         extra={"request_id": rid, "status": error.status,
                                "error": type(exc).__name__})
        elif status == 504:  # an asyncio.TimeoutError escaped the app
            error = DeadlineExceeded("a timeout escaped the request handler")
            http_log.warning("timeout outside the app", extra={"request_id": rid})
        else:
            error = GatewayError("internal error")
            http_log.error("unhandled error outside the app", exc_info=exc,
                           extra={"request_id": rid})
        if request.writer.output_size > 0:  # the response has started: only closing is left
            raise ConnectionError("response already started; cannot send an error")
        response = error_response(error, rid)
        response.force_close()
        return response


class GatewayServer(web.Server):
    """aiohttp's low-level server, making each connection's protocol a ``GatewayRequestHandler``.

    ``web.Server.__call__`` hard-codes ``RequestHandler``; this passes the same arguments
    (``handler_args`` included) to the subclass.
    """

    def __init__(self, *args: Any, limits: ConnectionLimits | None = None,
                 gate: HeadGate | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or ConnectionLimits()
        self.gate = gate

    def __call__(self) -> web.RequestHandler:
        return GatewayRequestHandler(self, loop=self._loop, limits=self.limits, gate=self.gate,
                                     **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` serving through ``GatewayServer`` (tests use it through a TestServer)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app, applies handler_args
        settings = self.app.get(state.SETTINGS)
        limits = ConnectionLimits() if settings is None else ConnectionLimits(
            header_timeout_s=settings.connections.header_timeout_s,
            body_timeout_s=settings.connections.body_timeout_s,
            max_connections=settings.connections.max_per_worker)
        gate = (ReadGate(self.app) if settings is not None
                and settings.admission.refuse_at_read else None)
        return GatewayServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation,
                             loop=asyncio.get_running_loop(), limits=limits, gate=gate,
                             **server._kwargs)


async def _freeze_gc(_app: object) -> None:
    """Move start-up objects out of the collector's sight.

    Full collections over the (large, long-lived) start-up heap took 23-31 ms every few seconds
    under load and set every p99, shed responses' too (bench/RESULTS.md, Overload).
    """
    gc.collect()
    gc.freeze()


def _child(settings: Settings, policy_share: str) -> None:
    sys.exit(run_worker(settings, reuse_port=True, policy_share=policy_share))


def supervise(settings: Settings, workers: int) -> int:
    """Start ``workers`` processes on one port; restart any that dies; stop all on a signal.

    The workers share one folder for their policy reads (``gateway/policy/share.py``): all of
    them serve the last policy any of them read valid, whichever one a reload reached."""
    mpdir = tempfile.mkdtemp(prefix="gateway-metrics-")
    policy_share = tempfile.mkdtemp(prefix="gateway-policy-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mpdir
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    stopping = False

    def start_one() -> multiprocessing.process.BaseProcess:
        proc = ctx.Process(target=_child, args=(settings, policy_share), daemon=False)
        proc.start()
        return proc

    def on_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)

    def on_hup(signum: int, _frame: object) -> None:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGHUP)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    log.info("starting workers", extra={"workers": workers, "port": settings.port})
    procs.extend(start_one() for _ in range(workers))
    restarts: list[float] = []
    code = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for i, proc in enumerate(procs):
                if proc.is_alive() or stopping:
                    continue
                _mark_dead(proc.pid)
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 60.0] + [now]
                if proc.exitcode == 2 or len(restarts) > 5 * workers:
                    log.error("worker failed; giving up",
                              extra={"exitcode": proc.exitcode, "restarts": len(restarts)})
                    code = 1
                    on_stop(signal.SIGTERM, None)
                    break
                log.warning("worker died; restarting", extra={"exitcode": proc.exitcode})
                procs[i] = start_one()
    finally:
        for proc in procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(mpdir, ignore_errors=True)
        shutil.rmtree(policy_share, ignore_errors=True)
    return code


def _mark_dead(pid: int | None) -> None:
    if pid is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
