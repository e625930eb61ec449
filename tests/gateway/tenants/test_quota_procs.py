"""Quotas hold across gateway processes: two real ``python -m gateway serve`` processes sharing
one real Redis charge the same counters, so a tenant gets its limit once, not once per process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.tenants.directory import key_digest
from tests.conftest import REPO, free_port
from tests.gateway.conftest import BackendProc, gateway_env, stop_process, wait_ready

KEY = "procs-quota-key-0001"


def start_gateway(backend: BackendProc, redis_url: str, tenants: Path,
                  **env: str) -> tuple[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--backend", backend.url, "--redis", redis_url, "--workers", "1", "--tenants",
           str(tenants)]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**gateway_env(), **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/readyz", timeout_s=60, what="gateway")
    except BaseException:
        stop_process(proc)
        raise
    return f"http://127.0.0.1:{port}", proc


def test_two_processes_sharing_redis_enforce_one_limit(backend: BackendProc, redis_url: str,
                                                       tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    # Nothing refills during the test (one request per 100 s, one text per 100 s): the counts
    # are exact, not a matter of timing.
    tenants.write_text(textwrap.dedent(f"""
        tenants:
          acme:
            api_keys_sha256: ["{key_digest(KEY)}"]
            quota: {{requests_per_s: 0.01, requests_burst: 8, texts_per_s: 0.01,
                     texts_burst: 10}}
    """), encoding="utf-8")
    procs = []
    try:
        a_url, a = start_gateway(backend, redis_url, tenants)
        procs.append(a)
        b_url, b = start_gateway(backend, redis_url, tenants)
        procs.append(b)
        headers = {"Authorization": f"Bearer {KEY}"}
        statuses: list[tuple[str, int]] = []
        remaining: list[str] = []
        with httpx.Client(timeout=30) as http:
            for i in range(6):  # 3 texts each, alternating processes: texts run out first
                url = a_url if i % 2 == 0 else b_url
                r = http.post(f"{url}/v1/embeddings", headers=headers, json={
                    "model": "minilm", "input": [f"procs {i} {j}" for j in range(3)]})
                statuses.append(("a" if url == a_url else "b", r.status_code))
                remaining.append(r.headers["RateLimit"])
            for i in range(6):  # cached texts are free: only the request limit is left
                url = a_url if i % 2 == 0 else b_url
                r = http.post(f"{url}/v1/embeddings", headers=headers, json={
                    "model": "minilm", "input": ["procs 0 0"]})
                statuses.append(("a" if url == a_url else "b", r.status_code))
    finally:
        for proc in procs:
            stop_process(proc)
    codes = [code for _, code in statuses]
    # 10 texts: three requests of 3 pass (9), the fourth (3 more) is refused, and so on.
    assert codes[:6] == [200, 200, 200, 429, 429, 429]
    # 8 requests in all, across both processes: 6 were used above, 2 are left.
    assert codes[6:] == [200, 200, 429, 429, 429, 429]
    # Each process saw the other's charges: the count went down across them.
    assert [h.split(";")[1] for h in remaining[:3]] == ["r=7", "r=6", "r=5"]


def quota_file(path: Path, burst: int) -> Path:
    path.write_text(textwrap.dedent(f"""
        tenants:
          acme:
            api_keys_sha256: ["{key_digest(KEY)}"]
            quota: {{requests_per_s: 0.01, requests_burst: {burst}}}
    """), encoding="utf-8")
    return path


def test_sighup_reloads_the_tenants_file(backend: BackendProc, redis_url: str,
                                         tmp_path: Path) -> None:
    tenants = quota_file(tmp_path / "tenants.yaml", 1)
    url, proc = start_gateway(backend, redis_url, tenants,
                              GATEWAY_QUOTAS_POLL_INTERVAL_S="3600")  # no file watching
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "minilm", "input": ["sighup"]}
        with httpx.Client(timeout=30) as http:
            assert http.post(f"{url}/v1/embeddings", headers=headers, json=body).status_code == 200
            assert http.post(f"{url}/v1/embeddings", headers=headers, json=body).status_code == 429
            quota_file(tenants, 100)
            os.kill(proc.pid, signal.SIGHUP)
            policy = ""
            for _ in range(100):  # the reload runs in the background: 10 s at most
                r = http.post(f"{url}/v1/embeddings", headers=headers, json=body)
                policy = r.headers["RateLimit-Policy"]
                if r.status_code == 200:
                    break
                time.sleep(0.1)
        assert policy == '"requests";q=100;w=10000'
    finally:
        stop_process(proc)
