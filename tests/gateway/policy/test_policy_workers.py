"""Issue 20, items 9 and 10, as a user runs the gateway: ``make run`` serves ``policies/`` (an
edit takes effect, ``/readyz`` names the source), and the workers of one gateway serve one policy
version after every reload, even when a valid and an invalid edit follow each other quickly and
an admin reload reaches one worker only."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import REPO, free_port
from tests.gateway.conftest import BackendProc, gateway_env, stop_process, wait_ready

POLICY = """
version: {label}
rules:
  - name: no-cache-debug
    match: {{headers: {{x-debug: "1"}}}}
    cache: false
  - name: default
"""
INVALID = "version: broken\nrules:\n  - name: default\n    ttl: forever\n    scope: nobody\n"
TOKEN = "admin-token-for-policy-workers"


def readyz(url: str) -> dict[str, object]:
    # A connection of its own each time, so the kernel spreads the calls over the workers.
    r = httpx.get(f"{url}/readyz", headers={"Connection": "close"}, timeout=5)
    doc: dict[str, object] = r.json()
    return doc


def versions(url: str, workers: int = 2, calls: int = 200) -> dict[int, str]:
    """Every worker's policy version (pid -> version), from /readyz over fresh connections."""
    seen: dict[int, str] = {}
    for _ in range(calls):
        doc = readyz(url)
        seen[int(str(doc["worker_pid"]))] = str(doc["policy_version"])
        if len(seen) >= workers:
            break
    assert len(seen) == workers, f"only {len(seen)} of {workers} workers answered /readyz"
    return seen


def settle(url: str, want: Callable[[str], bool], timeout_s: float = 20.0) -> dict[int, str]:
    """Wait (bounded) until every worker serves a version ``want`` accepts."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = versions(url)
        if all(want(v) for v in seen.values()) or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


def test_workers_serve_one_version_through_rapid_valid_and_invalid_edits(
        backend: BackendProc, tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    policy = folder / "default.yaml"
    policy.write_text(POLICY.format(label="default-2"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = gateway_env() | {"GATEWAY_ADMIN_TOKEN": TOKEN,
                           "GATEWAY_POLICIES_POLL_INTERVAL_S": "1.0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--backend", backend.url,
         "--workers", "2", "--policies", str(folder)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(proc, f"{url}/readyz", timeout_s=90, what="gateway")
        assert set(settle(url, lambda v: v.startswith("default-2+")).values()) == {
            next(iter(versions(url).values()))}
        for n in range(3, 8):
            label = f"default-{n}"
            policy.write_text(POLICY.format(label=label))
            r = httpx.post(f"{url}/admin/policies/reload", timeout=10,
                           headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200 and r.json()["version"].startswith(f"{label}+"), r.text
            time.sleep(0.3)
            policy.write_text(INVALID)  # before the other worker's next poll, most rounds
            seen = settle(url, lambda v, label=label: v.startswith(f"{label}+"))
            assert len(set(seen.values())) == 1 and all(
                v.startswith(f"{label}+") for v in seen.values()), (
                f"round {n}: workers serve {seen} while the file is invalid")
            time.sleep(2.5)  # two more polls of the (still invalid) file: nothing moves
            assert set(versions(url).values()) == set(seen.values()), f"round {n}: drifted"
    finally:
        stop_process(proc)


def test_make_run_serves_the_policies_folder_and_an_edit_takes_effect(tmp_path: Path) -> None:
    """``deploy/run-local.sh`` (what ``make run`` execs) from a checkout-like folder: its
    ``policies/`` is served, ``/readyz`` says so, and editing the file changes the answers."""
    shutil.copytree(REPO / "policies", tmp_path / "policies")
    (tmp_path / "models").symlink_to(REPO / "models")
    backend_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    env = gateway_env() | {"PY": sys.executable, "BACKEND_PORT": str(backend_port),
                           "GATEWAY_PORT": str(gateway_port), "BACKEND_THREADS": "1",
                           "BACKEND_GRPC_PORT": str(free_port()), "READY_TIMEOUT_S": "150"}
    env.pop("POLICIES", None)
    # Its stderr (why it stopped, the services' logs) goes to a file, for the failure message.
    log = tmp_path / "run-local.log"
    with log.open("wb") as err:
        run = subprocess.Popen(["bash", str(REPO / "deploy" / "run-local.sh")], cwd=tmp_path,
                               env=env, stdout=subprocess.PIPE, stderr=err,
                               start_new_session=True)
    try:
        assert run.stdout is not None
        for line in run.stdout:  # bounded by READY_TIMEOUT_S: the script exits past it
            if line.startswith(b"ready"):
                break
        assert run.poll() is None, (
            f"make run did not get ready:\n{log.read_text(errors='replace')[-3000:]}")
        # "ready" means one worker is; the other may still be checking the backend's health.
        deadline = time.monotonic() + 60
        while not all(readyz(url)["ready"] for _ in range(8)) and time.monotonic() < deadline:
            time.sleep(0.5)
        doc = readyz(url)
        assert doc["policy_source"] == "policies" and str(doc["policy_version"]).startswith(
            "default-1+")
        body = {"model": "minilm", "input": "an edited policy decides this"}
        debug = {"X-Debug": "1", "Connection": "close"}
        r = httpx.post(f"{url}/v1/embeddings", json=body, headers=debug, timeout=30)
        assert r.status_code == 200 and r.headers["X-Cache-Policy"].startswith("default@"), r.text
        (tmp_path / "policies" / "default.yaml").write_text(POLICY.format(label="default-2"))
        seen = settle(url, lambda v: v.startswith("default-2+"))
        assert all(v.startswith("default-2+") for v in seen.values()), seen
        r = httpx.post(f"{url}/v1/embeddings", json=body, headers=debug, timeout=30)
        assert (r.headers["X-Cache"], r.headers["X-Cache-Policy"].split("@")[0]) == (
            "BYPASS", "no-cache-debug")
    finally:
        os.killpg(run.pid, signal.SIGTERM)  # the script stops the backend and gateway it started
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_make_run_passes_the_policies_folder() -> None:
    out = subprocess.run(["make", "-n", "run"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "POLICIES=policies" in out and "deploy/run-local.sh" in out
