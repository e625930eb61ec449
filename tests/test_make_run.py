"""``make run`` and ``make clean`` as a new user meets them (issue 20, item 11): the backend's
gRPC port is a variable, ``kill <pid>`` as the ready line suggests stops everything without
make reporting an error, and ``make clean`` removes the node cache tier's directory."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.procs import free_port

REPO = Path(__file__).resolve().parent.parent
READY_S = 180.0


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.model
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_takes_the_grpc_port_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    ports = {"BACKEND_PORT": free_port(), "BACKEND_GRPC_PORT": free_port(),
             "GATEWAY_PORT": free_port()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({k: str(v) for k, v in ports.items()})
    env.update({"GATEWAY_ARGS": "--workers 1 --log-level WARNING",
                "GATEWAY_CACHE_NODE_PATH": str(tmp_path / "node"), "READY_TIMEOUT_S": "170"})
    log = (tmp_path / "make.log").open("w+b")
    make = subprocess.Popen(["make", "--no-print-directory", "run"], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_S
        pid = None
        while time.monotonic() < deadline and make.poll() is None:
            text = (tmp_path / "make.log").read_text(errors="replace")
            if "ready: gateway" in text:
                found = re.search(r"make run \(pid (\d+);", text)
                assert found, text
                pid = int(found.group(1))
                break
            time.sleep(0.5)
        text = (tmp_path / "make.log").read_text(errors="replace")
        assert pid is not None, f"no ready line: {text[-2000:]}"
        assert _listening(ports["BACKEND_GRPC_PORT"]), "gRPC is not on the port asked for"
        os.kill(pid, signal.SIGTERM)
        code = make.wait(timeout=60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(timeout=30)
        log.close()
    text = (tmp_path / "make.log").read_text(errors="replace")
    assert code == 0, text[-2000:]
    assert "Error" not in text.split("ready: gateway", 1)[1], text[-2000:]
    for port in ports.values():  # everything it started has stopped
        assert not _listening(port), port


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_removes_the_node_tier_the_settings_name(tmp_path: Path) -> None:
    """``make clean`` in a scratch copy (it would remove this checkout's .venv): a stand-in
    .venv/bin/python that runs this checkout's gateway package answers ``node-path``."""
    work = tmp_path / "checkout"
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", work / "Makefile")
    python = work / ".venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    node = tmp_path / "node-tier"
    node.mkdir()
    (node / "data.mdb").write_bytes(b"entries")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_CACHE_NODE_PATH"] = str(node)
    done = subprocess.run(["make", "--no-print-directory", "clean"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not node.exists()
    assert not (work / ".venv").exists()
