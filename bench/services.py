"""The servers the gateway and overload benchmarks start, each as a pinned ``Service``.

Factories return a started ``Service`` (use it in a ``with`` block or an ``ExitStack`` so it is
stopped by PID whatever happens) and wait until it answers. Every server listens on a free
loopback port; the URL is on the returned object. Gateway settings go in through a YAML config
file (typed values), and the caller's own ``GATEWAY_*`` variables are dropped so they cannot
skew a run.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.procs import Service, clean_env, free_port

__all__ = ["Server", "Service", "started"]


@dataclass
class Server:
    """A started service and where it listens."""

    service: Service
    port: int
    workdir: str | None = None
    grpc_port: int | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        """The loopback address every bench service listens on."""
        return "127.0.0.1"

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT`` (for nginx's upstream)."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stops the process by PID and removes its work directory."""
        try:
            self.service.stop()
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def started(service: Service, port: int, ready_path: str | None, timeout_s: float,
            workdir: str | None = None, grpc_port: int | None = None) -> Server:
    """Starts ``service`` and waits until ``ready_path`` answers 200 (stopped on failure)."""
    server = Server(service.start(), port, workdir, grpc_port)
    try:
        if ready_path is not None:
            service.wait_http(server.url + ready_path, timeout_s=timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def backend(models: Path, *, cores: frozenset[int] | None, threads: int = 1,
            grpc: bool = False) -> Server:
    """``python -m backend serve`` with the real model, ready (warmed up) on return; with
    ``grpc`` its gRPC service listens too (``Server.grpc_port``)."""
    port = free_port()
    argv = [sys.executable, "-m", "backend", "serve", "--models", str(models), "--host",
            "127.0.0.1", "--port", str(port), "--threads", str(threads), "--device", "cpu",
            "--log-level", "WARNING"]
    grpc_port = free_port() if grpc else None
    if grpc_port is not None:
        argv += ["--grpc-port", str(grpc_port)]
    return started(Service("backend", argv, cores=cores), port, "/v2/health/ready", 240.0,
                   grpc_port=grpc_port)


def slow_backend(*, cores: frozenset[int] | None, slots: int, service_ms: float,
                 max_queue: int = 1024) -> Server:
    """The fixed-capacity fake OIP backend (``bench.slow_backend``)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.slow_backend", "--port", str(port), "--slots",
            str(slots), "--service-ms", str(service_ms), "--max-queue", str(max_queue)]
    return started(Service("slow-backend", argv, cores=cores), port, "/v2/health/ready", 30.0)


def hello(*, cores: frozenset[int] | None) -> Server:
    """The bare aiohttp hello-world (``bench.hello``)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.hello", "--port", str(port)]
    return started(Service("hello", argv, cores=cores), port, "/", 30.0)


def floor(answer_file: Path, *, cores: frozenset[int] | None, prefix: Sequence[str] = (),
          ready_timeout_s: float = 30.0) -> Server:
    """The hit floor: aiohttp + uvloop answering a stored gateway hit (``bench.floor``);
    ``prefix``: a wrapper command (valgrind for ``bench cpu``)."""
    port = free_port()
    argv = [*prefix, sys.executable, "-m", "bench.floor", "--port", str(port), "--answer",
            str(answer_file)]
    return started(Service("floor", argv, cores=cores), port, "/", ready_timeout_s)


def gateway(backend_url: str, *, cores: frozenset[int] | None, redis_url: str | None = None,
            settings: Mapping[str, object] | None = None,
            name: str = "gateway", workers: int = 1, src: Path | None = None,
            prefix: Sequence[str] = (), ready_timeout_s: float = 60.0) -> Server:
    """``python -m gateway serve --workers N`` (1) in front of ``backend_url``; ``settings``
    (nested sections or dotted names -> values, as gateway/settings loads them) go in a YAML
    config file (``--config``) in the server's work dir. Its node cache starts empty in that
    work dir too (never the user's), unless ``settings`` name another ``cache.node.path``.
    ``src``: run the gateway package of another checkout (before/after runs); ``prefix``: a
    wrapper command (valgrind for ``bench cpu``)."""
    port = free_port()
    argv = [*prefix, sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port",
            str(port), "--backend", backend_url, "--workers", str(workers)]
    if redis_url is not None:
        argv += ["--redis", redis_url]
    workdir = tempfile.mkdtemp(prefix=f"bench-{name}-")
    # A config file, not GATEWAY_* variables: YAML keeps the values' types.
    values = dict(settings or {})
    if not _names_node_path(values):
        values["cache.node.path"] = str(Path(workdir) / "node")
    config = Path(workdir) / "gateway.yaml"
    config.write_text(yaml.safe_dump(values), encoding="utf-8")
    argv += ["--config", str(config)]
    service = Service(name, argv, cores=cores, env=clean_env(),
                      cwd=str(src) if src is not None else None)
    return started(service, port, "/readyz", ready_timeout_s, workdir)


def _names_node_path(settings: Mapping[str, object]) -> bool:
    cache = settings.get("cache")
    node = cache.get("node") if isinstance(cache, Mapping) else None
    return (any(k in settings for k in ("cache.node.path", "cache.node"))
            or (isinstance(cache, Mapping) and "node.path" in cache)
            or (isinstance(node, Mapping) and "path" in node))


def redis(*, cores: frozenset[int] | None) -> Server:
    """A private ``redis-server`` on a free port: no persistence, its own temp dir."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", workdir, "--protected-mode", "yes"]
    server = Server(Service("redis", argv, cores=cores).start(), port, workdir)
    try:
        _wait_redis(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_redis(server: Server, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.service.alive():
            raise RuntimeError(f"redis exited early:\n{server.service.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("redis did not answer PING")


def redis_url(server: Server) -> str:
    """``redis://127.0.0.1:PORT/0``."""
    return f"redis://127.0.0.1:{server.port}/0"
