"""The OS package's nginx as a caching reverse proxy on loopback: the hit-throughput yardstick.

``NginxCache`` writes a config into a temporary prefix directory (cache, temp files, logs and the
PID file all live there), then runs ``nginx -p DIR -c nginx.conf -g 'daemon off; ...'`` in the
foreground as a child ``Service`` with one worker process, pinned like the server under test.
POST answers are cached under ``$request_uri|$request_body`` for an hour, whatever the
upstream's own cache headers say, so after one request every identical POST is served by nginx
from its cache (the response carries ``X-Nginx-Cache: HIT``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
from pathlib import Path
from types import TracebackType

from bench.procs import Service, free_port

CONFIG = """\
{user}error_log {prefix}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests 1000000;
    client_body_buffer_size 64k;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=bench:10m max_size=100m inactive=1h
                     use_temp_path=off;
    upstream origin {{
        server {upstream};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_methods POST;
            proxy_cache_key "$request_uri|$request_body";
            proxy_cache_valid 200 1h;
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;
            add_header X-Nginx-Cache $upstream_cache_status;
        }}
    }}
}}
"""


def config(prefix: str, port: int, upstream: str) -> str:
    """The nginx.conf text: listen on 127.0.0.1:``port``, cache in ``prefix``, proxy to
    ``upstream`` (``host:port``)."""
    # nginx started as root drops its worker to "nobody", which could not write the cache in a
    # private temp dir; keep the worker as the invoking user instead.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    return CONFIG.format(user=user, prefix=prefix, port=port, upstream=upstream)


class NginxCache:
    """nginx with ``proxy_cache`` in front of ``upstream`` (``host:port``); a context manager
    that removes its temp dir and stops the master process by PID (SIGQUIT: graceful)."""

    def __init__(self, upstream: str, *, cores: frozenset[int] | None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.prefix = tempfile.mkdtemp(prefix="bench-nginx-")
        conf = Path(self.prefix) / "nginx.conf"
        conf.write_text(config(self.prefix, self.port, upstream), encoding="utf-8")
        globals_ = (f"daemon off; master_process on; worker_processes 1; "
                    f"pid {self.prefix}/nginx.pid;")
        self.service = Service(
            "nginx",
            [_binary(), "-p", self.prefix, "-c", str(conf), "-e", f"{self.prefix}/error.log",
             "-g", globals_],
            cores=cores, stop_signal=signal.SIGQUIT,
        )

    def __enter__(self) -> NginxCache:
        try:
            self.service.start()
            self.service.wait_http(self.base_url + "/healthz", timeout_s=15, status=None)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stops nginx (by the master's PID) and removes the prefix directory."""
        try:
            self.service.stop()
        finally:
            shutil.rmtree(self.prefix, ignore_errors=True)


def _binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if found is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx)")
    return found


def available() -> bool:
    """True when an nginx binary can be found."""
    try:
        _binary()
    except RuntimeError:
        return False
    return True
