"""``python -m backend`` as a user runs it: a real process, a real port, real signals."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from backend.__main__ import main
from backend.runtime import probe_gpu
from backend.settings import DEFAULT_GRPC_PORT
from tests.conftest import REPO, free_port

pytestmark = pytest.mark.model


def backend(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "backend", *args], cwd=REPO,
        env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.skipif(probe_gpu() is None, reason="a GPU works here")
def test_device_cuda_without_gpu_exits_2_and_says_why(models_dir: Path) -> None:
    proc = backend("serve", "--models", str(models_dir), "--port", str(free_port()),
                   "--device", "cuda")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    message = stderr.decode()
    assert "error: --device cuda: no working GPU:" in message
    assert "\"serving\"" not in message  # it never started listening


def test_bad_setting_exits_2(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--models", str(models_dir), "--threads", "0"]) == 2
    assert "threads" in capsys.readouterr().err


def test_serve_answers_then_stops_cleanly_on_sigint(models_dir: Path) -> None:
    port = free_port()
    proc = backend(
        "serve", "--models", str(models_dir), "--port", str(port), "--device", "cpu",
        "--zone", "z1", "--region", "r1",
        env={"BACKEND_WARMUP_LENGTHS": "8", "BACKEND_WARMUP_BATCH_SIZES": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if get(base + "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        else:
            pytest.fail("the backend never became ready")
        status, body = get(base + "/v2")
        assert status == 200 and orjson.loads(body)["zone"] == "z1"
        request = urllib.request.Request(
            base + "/v2/models/minilm/infer", method="POST",
            headers={"Content-Type": "application/json"},
            data=orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                           "data": ["hello"]}]}),
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert orjson.loads(response.read())["outputs"][0]["shape"] == [1, 384]
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = [line for line in stderr.decode().splitlines() if line.strip()]
    assert lines, "the server should log"
    records = [orjson.loads(line) for line in lines]  # every line is JSON
    assert any(r["msg"] == "model ready" for r in records)
    assert any(r["msg"] == "request" and r["path"] == "/v2/models/minilm/infer"
               for r in records)


def test_build_model_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["build-model", "--help"])
    assert info.value.code == 0 and "minilm" in capsys.readouterr().out


def test_a_grpc_port_asked_for_and_taken_exits_2_and_says_why(models_dir: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        grpc_port = taken.getsockname()[1]
        proc = backend("serve", "--models", str(models_dir), "--port", str(free_port()),
                       "--grpc-port", str(grpc_port), "--device", "cpu",
                       env={"BACKEND_WARMUP_LENGTHS": "8", "BACKEND_WARMUP_BATCH_SIZES": "1"})
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"error: cannot listen for gRPC on 127.0.0.1:{grpc_port}" in stderr.decode()


def test_the_default_grpc_port_taken_leaves_rest_serving_with_a_warning(models_dir: Path) -> None:
    # 8002 is taken while this runs: by this socket, or already by something else.
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            stack.enter_context(socket.create_server(("127.0.0.1", DEFAULT_GRPC_PORT)))
        port = free_port()
        proc = backend("serve", "--models", str(models_dir), "--port", str(port),
                       "--device", "cpu",
                       env={"BACKEND_WARMUP_LENGTHS": "8", "BACKEND_WARMUP_BATCH_SIZES": "1"})
        try:
            for _ in range(600):  # bounded: 60 s
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                with contextlib.suppress(OSError):
                    if get(f"http://127.0.0.1:{port}/v2/health/ready")[0] == 200:
                        break
                time.sleep(0.1)
            else:
                pytest.fail("the backend never became ready")
        finally:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    records = [orjson.loads(line) for line in stderr.decode().splitlines() if line.strip()]
    assert any(r["msg"] == "default gRPC port taken; serving REST only" for r in records)
