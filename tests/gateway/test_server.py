"""The gateway as a user runs it: processes, workers sharing a port, metrics across workers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import REPO, free_port
from tests.gateway.conftest import BackendProc, gateway_env, metric_value, stop_process, wait_ready


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", *args], cwd=REPO,
                            env=gateway_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_two_workers_share_the_port_and_metrics(backend: BackendProc) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(["--port", str(port), "--backend", backend.url, "--workers", "2"])
    try:
        wait_ready(proc, f"{url}/readyz", timeout_s=60, what="gateway")
        # The listening socket's backlog (`ss` shows it as a listener's Send-Q): the setting
        # connections.backlog (1024), as far as the kernel's somaxconn allows.
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        listing = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                                 text=True, check=True).stdout.split()
        assert int(listing[2]) == min(1024, somaxconn), listing
        with httpx.Client(timeout=10) as http:
            for i in range(40):
                # A new connection each time so the kernel spreads them over both workers.
                r = httpx.post(f"{url}/v1/embeddings",
                               json={"model": "minilm", "input": f"worker test {i % 5}"},
                               headers={"Connection": "close"})
                assert r.status_code == 200
            # Each worker hands its counts to the shared files at least once a second
            # (gateway/telemetry/batched_counts.py); the worker that answers the scrape flushes its
            # own first.
            deadline = time.monotonic() + 10.0
            while True:
                text = http.get(f"{url}/metrics").text
                total = metric_value(text, "gateway_requests_total", route="/v1/embeddings",
                                     status="200")
                if total >= 40 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert total == 40, "metrics must add up across worker processes"
        assert metric_value(text, "gateway_cache_items_total", result="miss") >= 5
    finally:
        stop_process(proc)
    assert proc.returncode == 0


def test_bad_settings_stop_startup_with_a_message() -> None:
    proc = _start(["--port", str(free_port()), "--backend", "ftp://nowhere"])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"backends" in err and b"ftp://nowhere" in err
    proc = _start(["--port", str(free_port())])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"backend" in err
