"""Process model: one worker in-process, or a supervisor with N workers sharing the port.

Workers bind the same port with SO_REUSEPORT and the kernel spreads connections between them.
Prometheus metrics are shared through prometheus-client's multiprocess mode: the supervisor makes a
fresh ``PROMETHEUS_MULTIPROC_DIR`` before any worker starts, so ``/metrics`` on any worker reports
all of them. SIGTERM/SIGINT stop every worker; SIGHUP is forwarded (policy reload).
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
from typing import Any

from gateway.logs import setup_logging
from gateway.settings import Settings, SettingsError, load_settings

log = logging.getLogger("gateway.server")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("host", "port", "backends", "redis_url", "policies", "shadow_policies",
            "tenants_file", "workers", "region", "zone", "log_level")
    return {k: getattr(args, k, None) for k in keys}


def serve(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config, _overrides(args))
        if not settings.backends:
            raise SettingsError("backends: at least one backend is required (--backend URL)")
    except SettingsError as exc:
        print(f"gateway: invalid settings: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    workers = settings.workers or (os.cpu_count() or 1)
    if workers == 1:
        return run_worker(settings, reuse_port=False)
    return supervise(settings, workers)


def run_worker(settings: Settings, *, reuse_port: bool) -> int:
    """Run one gateway process until SIGTERM/SIGINT."""
    from aiohttp import web

    from gateway.app import create_app

    setup_logging(settings.log_level)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # uvloop is optional off Linux/macOS
        pass
    try:
        app = create_app(settings, handle_signals=True)
    except (SettingsError, ValueError, OSError) as exc:
        print(f"gateway: cannot start: {exc}", file=sys.stderr)
        return 2
    app.on_startup.append(_freeze_gc)
    log.info("gateway listening", extra={"host": settings.host, "port": settings.port,
                                          "pid": os.getpid()})
    web.run_app(app, host=settings.host, port=settings.port, reuse_port=reuse_port,
                access_log=None, print=None, handle_signals=True, shutdown_timeout=10.0)
    return 0


async def _freeze_gc(_app: object) -> None:
    """Move start-up objects out of the collector's sight.

    Full collections over the (large, long-lived) start-up heap took 23-31 ms every few seconds
    under load and set every p99, shed responses' too (bench/RESULTS.md, Overload).
    """
    gc.collect()
    gc.freeze()


def _child(settings: Settings) -> None:
    sys.exit(run_worker(settings, reuse_port=True))


def supervise(settings: Settings, workers: int) -> int:
    """Start ``workers`` processes on one port; restart any that dies; stop all on a signal."""
    mpdir = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mpdir
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    stopping = False

    def start_one() -> multiprocessing.process.BaseProcess:
        proc = ctx.Process(target=_child, args=(settings,), daemon=False)
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
    return code


def _mark_dead(pid: int | None) -> None:
    if pid is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
