"""A small HTTP reverse proxy in front of one model server, as a Kubernetes Service, a sidecar or
an ingress sits in front of it, with faults on cue and counts of what it saw.

``python -m bench.fault_proxy --port P --upstream http://127.0.0.1:8001 [--timeout-s 30]``

Every request is passed to the upstream as is and its answer passed back. When the upstream is
gone (refused, reset, closed mid-answer) the proxy answers **502**, when it does not answer within
``--timeout-s`` **504**, as nginx does; it never refuses a connection itself. Control routes
(loopback only, never forwarded):

- ``POST /_proxy/fault`` ``{"status": 500, "count": 10, "infer_only": false}``: answer that
  status instead of forwarding, to the next ``count`` requests (all while set when ``count`` is
  null; ``infer_only`` leaves health and metadata routes alone); ``{"status": null}`` clears it.
- ``GET /_proxy/stats``: infer requests seen, retries among them (``X-Attempt-Count`` > 1, the
  gateway's try number), in flight now and at most, for both, and answers by status.
- ``POST /_proxy/reset``: zero the counts.

Used by the resilience tests (tests/gateway/test_resilience*.py) and ``python -m bench
resilience``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
from aiohttp import web

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "host", "content-length", "proxy-connection"}


class Counts:
    """What the proxy saw (infer requests only)."""

    def __init__(self) -> None:
        self.requests = 0
        self.retries = 0
        self.inflight = 0
        self.max_inflight = 0
        self.retries_inflight = 0
        self.max_retries_inflight = 0
        self.by_status: Counter[str] = Counter()

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "retries": self.retries, "inflight": self.inflight,
                "max_inflight": self.max_inflight, "retries_inflight": self.retries_inflight,
                "max_retries_inflight": self.max_retries_inflight,
                "by_status": dict(self.by_status)}


class FaultProxy:
    """The proxy's state: upstream, the current fault, the counts."""

    def __init__(self, upstream: str, *, timeout_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.fault_status: int | None = None
        self.fault_left: int | None = None
        self.infer_only = False
        self.counts = Counts()
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/_proxy/fault", self.set_fault)
        app.router.add_get("/_proxy/stats", self.stats)
        app.router.add_post("/_proxy/reset", self.reset)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await self.session.close()

    async def set_fault(self, request: web.Request) -> web.Response:
        doc = await request.json()
        self.fault_status = doc.get("status")
        self.fault_left = doc.get("count")
        self.infer_only = bool(doc.get("infer_only", False))
        return web.json_response({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.counts.as_json())

    async def reset(self, request: web.Request) -> web.Response:
        self.counts = Counts()
        return web.json_response({"ok": True})

    def _fault_for(self, infer: bool) -> int | None:
        if self.fault_status is None or (self.infer_only and not infer):
            return None
        status = self.fault_status
        if self.fault_left is not None:
            self.fault_left -= 1
            if self.fault_left <= 0:
                self.fault_status = self.fault_left = None
        return status

    async def forward(self, request: web.Request) -> web.StreamResponse:
        infer = request.path.endswith("/infer")
        if not infer:
            return await self._answer(request, infer)
        counts = self.counts
        retry = int(request.headers.get("X-Attempt-Count", "1") or 1) > 1
        counts.requests += 1
        counts.inflight += 1
        counts.max_inflight = max(counts.max_inflight, counts.inflight)
        if retry:
            counts.retries += 1
            counts.retries_inflight += 1
            counts.max_retries_inflight = max(counts.max_retries_inflight,
                                              counts.retries_inflight)
        status = 0
        try:
            response = await self._answer(request, infer)
            status = response.status
            return response
        finally:
            counts.inflight -= 1
            if retry:
                counts.retries_inflight -= 1
            counts.by_status[str(status or 499)] += 1

    async def _answer(self, request: web.Request, infer: bool) -> web.Response:
        fault = self._fault_for(infer)
        if fault is not None:
            return web.json_response({"error": f"proxy fault {fault}"}, status=fault)
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        try:
            async with self.session.request(
                request.method, self.upstream + request.path_qs, data=body or None,
                headers=headers, timeout=self.timeout,
            ) as upstream:
                payload = await upstream.read()
                out = {k: v for k, v in upstream.headers.items()
                       if k.lower() not in _HOP_BY_HOP | {"content-encoding", "server", "date"}}
                return web.Response(status=upstream.status, body=payload, headers=out)
        except TimeoutError:
            return web.json_response({"error": "upstream timed out"}, status=504)
        except aiohttp.ClientError as exc:
            return web.json_response({"error": f"upstream unavailable: {type(exc).__name__}"},
                                     status=502)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fault_proxy", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://host:port of the server")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream, timeout_s=args.timeout_s)
    web.run_app(proxy.app(), host="127.0.0.1", port=args.port, access_log=None,
                print=None, handle_signals=True)
    return 0


@dataclass
class ProxyProc:
    """A started ``bench.fault_proxy`` process (stop it by ``stop``: its PID)."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]

    def fault(self, status: int | None, *, count: int | None = None,
              infer_only: bool = False) -> None:
        """Answer ``status`` instead of forwarding (None: forward again)."""
        httpx.post(f"{self.url}/_proxy/fault", timeout=5,
                   json={"status": status, "count": count, "infer_only": infer_only})

    def stats(self) -> dict[str, Any]:
        """The counts (``Counts.as_json``)."""
        doc: dict[str, Any] = httpx.get(f"{self.url}/_proxy/stats", timeout=5).json()
        return doc

    def reset(self) -> None:
        httpx.post(f"{self.url}/_proxy/reset", timeout=5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_proxy(upstream: str, port: int, *, timeout_s: float = 30.0,
                cwd: str | None = None) -> ProxyProc:
    """``python -m bench.fault_proxy`` on ``port`` in front of ``upstream``, answering (any
    status) on return."""
    argv = [sys.executable, "-m", "bench.fault_proxy", "--port", str(port), "--upstream",
            upstream, "--timeout-s", str(timeout_s)]
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a full pipe would block it
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"fault proxy exited with {proc.returncode}: {err[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/_proxy/stats", timeout=1)
                return ProxyProc(url, port, proc)
            time.sleep(0.05)
    ProxyProc(url, port, proc).stop()
    raise TimeoutError("fault proxy did not answer in 30 s")


if __name__ == "__main__":
    sys.exit(main())
