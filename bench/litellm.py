"""The LiteLLM proxy as a peer in the hit table: what a user might run instead of the gateway.

LiteLLM is not a dependency of this project: it gets a venv of its own under the bench's cache
directory (``$XDG_CACHE_HOME/edge-gateway-bench/litellm-<version>``, else ``~/.cache/...``),
made once with this Python's ``venv`` and ``pip install 'litellm[proxy]==VERSION'`` and reused
after (a marker file says the install finished). When it cannot be installed or started (no
network, a failed build, a missing binary, a proxy that exits), ``serving`` yields ``None`` and
the peer keeps a one-line reason that the report prints in place of the row: the bench never
fails because of LiteLLM.

The proxy (``litellm --config ...``, uvicorn, one worker) runs pinned to the server core like
every other server, in front of our backend: its model ``minilm`` is ``openai/minilm`` at the
backend's OpenAI-compatible ``/v1``, with LiteLLM's own in-memory response cache on
(``litellm_settings.cache: true``, ``cache_params.type: local``, a TTL longer than any run), no
master key (no auth), no database, telemetry off, the model cost map read from the package (no
fetch), LiteLLM's logger at ERROR and uvicorn's access log off. Before any timing the cache is
checked from outside: the first request reaches the backend, and the next ``REPEATS`` identical
ones must not (the backend's ``backend_requests_total`` does not move), with the same embedding
as the backend's own answer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.gateway_probe import fetch, metric_samples
from bench.gateway_throughput import Row
from bench.procs import Service, clean_env, free_port
from bench.services import Server

VERSION = "1.100.5"  # tested here; the newest whose [proxy] extra resolves on this index
REQUIREMENT = f"litellm[proxy]=={VERSION}"
ROW = "LiteLLM proxy, cached embedding"
MODEL = "minilm"
REPEATS = 3  # identical requests after the first that must all come from LiteLLM's cache
INSTALL_TIMEOUT_S = 1200.0
START_TIMEOUT_S = 180.0
CACHE_TTL_S = 24 * 3600
READY_PATH = "/health/liveliness"
MARKER = "bench-installed.txt"
# uvicorn's loggers at WARNING and its access log off: no line per request.
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                            "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "uvicorn.error": {"level": "WARNING"},
        "uvicorn.access": {"handlers": [], "level": "ERROR", "propagate": False},
    },
}


class Unavailable(Exception):
    """LiteLLM cannot be installed or started here; the message is the one-line reason."""


@dataclass
class Peer:
    """The LiteLLM row: measured, or skipped with the reason."""

    row: Row = field(default_factory=lambda: Row(ROW))
    reason: str = ""  # why there is no measurement ("" when there is one)
    version: str = ""  # what the running proxy reported (x-litellm-version)
    check: str = ""  # how its cache was confirmed
    backend_calls: float | None = None  # backend requests during the timed hit runs

    @property
    def skipped(self) -> bool:
        """No measurement: it could not be installed, started or confirmed as a cache."""
        return bool(self.reason) or not self.row.runs

    def markdown(self) -> str:
        """The hit table's row, or the reason in its place."""
        if self.reason:
            return (f"| {ROW}: skipped ({_cell(self.reason)}) | - | - | - | - | - | - | - "
                    "| - |")
        return self.row.markdown()

    def targets(self, gateway: Row) -> list[str]:
        """The targets table's info lines: the gateway's L1-hit req/s over LiteLLM's cached
        req/s, and LiteLLM's server CPU per hit over the gateway's (less swayed by a shared
        machine's load than req/s)."""
        names = ("gateway L1-hit req/s / LiteLLM proxy cached req/s (info)",
                 "LiteLLM's CPU per cached hit / gateway's CPU per L1 hit (info)")
        if self.skipped:
            return [f"| {name} | skipped | - | - |" for name in names]
        values = (_ratio(gateway.rps, self.row.rps),
                  _ratio(cpu_per_request(self.row), cpu_per_request(gateway)))
        return [f"| {name} | {value:.3f} | - | - |" for name, value in zip(names, values,
                                                                          strict=True)]

    def notes(self) -> list[str]:
        """The report's lines about the peer (what ran, how its cache was confirmed)."""
        if self.reason:
            return [f"- {ROW}: skipped: {self.reason}"]
        lines = [f"- {ROW}: litellm {self.version or VERSION} (own venv), uvicorn, 1 worker, "
                 "in-memory response cache, no auth, no database, access log off; "
                 f"cache check: {self.check}"]
        if self.row.errors:
            transport = sum(r.errors for r in self.row.runs)
            lines.append(f"- {ROW}: errors over the timed runs: {transport} transport (wrk's "
                         "connect, read, write and timeout counts; its timeout is 5 s), "
                         f"{sum(r.non_2xx for r in self.row.runs)} non-2xx")
        if self.backend_calls is not None:
            lines.append(f"- Backend requests during the timed hit runs (a LiteLLM cache miss "
                         f"would show here): {self.backend_calls:.0f}")
        return lines


def cpu_per_request(row: Row) -> float:
    """Server CPU seconds per answered request in the median run (nan before any run)."""
    m = row.median
    if m is None or not row.cpu or m.rps <= 0:
        return float("nan")
    return statistics.median(row.cpu) / m.rps


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(b) else float("nan")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/edge-gateway-bench`` (``~/.cache/edge-gateway-bench`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-gateway-bench"


def venv_dir() -> Path:
    """Where the pinned LiteLLM's venv lives (one per version)."""
    return cache_root() / f"litellm-{VERSION}"


def install(venv: Path, *, python: str = sys.executable,
            timeout_s: float = INSTALL_TIMEOUT_S) -> Path:
    """The ``litellm`` CLI in ``venv``, installing it first unless a finished install is
    there; raises ``Unavailable`` with the reason (a failed attempt leaves no venv behind)."""
    exe = venv / "bin" / "litellm"
    if _installed(venv, exe):
        return exe
    deadline = time.monotonic() + timeout_s
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with _locked(venv.parent / f"{venv.name}.lock", deadline):
            if _installed(venv, exe):  # another bench finished it while we waited
                return exe
            shutil.rmtree(venv, ignore_errors=True)
            try:
                _build(venv, python, deadline)
            except BaseException:
                shutil.rmtree(venv, ignore_errors=True)
                raise
    except OSError as exc:
        raise Unavailable(f"cannot prepare {venv}: {_one_line(str(exc))}") from exc
    return exe


def _installed(venv: Path, exe: Path) -> bool:
    marker = venv / MARKER
    return exe.exists() and marker.exists() and marker.read_text().strip() == REQUIREMENT


def _build(venv: Path, python: str, deadline: float) -> None:
    print(f"bench: installing {REQUIREMENT} into {venv} (once; reused after)", file=sys.stderr,
          flush=True)
    _step([python, "-m", "venv", str(venv)], deadline, f"could not create a venv with {python}")
    log = venv.parent / f"{venv.name}-pip.log"
    _step([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
           "--log", str(log), REQUIREMENT],
          deadline, f"pip install '{REQUIREMENT}' failed (log: {log})")
    if not (venv / "bin" / "litellm").exists():
        raise Unavailable(f"pip installed {REQUIREMENT} but no litellm CLI is in {venv}/bin")
    (venv / MARKER).write_text(REQUIREMENT + "\n")
    log.unlink(missing_ok=True)


def _step(argv: Sequence[str], deadline: float, what: str) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Unavailable(f"{what}: no time left")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=left, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"{what}: still running after {exc.timeout:.0f} s") from exc
    except OSError as exc:
        raise Unavailable(f"{what}: {_one_line(str(exc))}") from exc
    if done.returncode != 0:
        raise Unavailable(f"{what}: {_last_error(done.stderr + done.stdout)}")


@contextlib.contextmanager
def _locked(path: Path, deadline: float) -> Iterator[None]:
    """An exclusive lock on ``path`` (two benches never build one venv at once), waited for
    until ``deadline``."""
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable(f"another install holds {path}") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def config(backend_url: str) -> dict[str, object]:
    """The proxy's config: ``minilm`` is an OpenAI-compatible model at the backend's ``/v1``;
    LiteLLM's local response cache on; nothing else (no key, no database, no callbacks)."""
    return {
        "model_list": [{
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{backend_url}/v1",
                               "api_key": "unused"},  # the openai provider wants one
        }],
        "litellm_settings": {
            "cache": True,
            "cache_params": {"type": "local", "ttl": CACHE_TTL_S},
            "telemetry": False,
            "json_logs": False,
        },
        "general_settings": {},
    }


def proxy(exe: Path, backend_url: str, *, cores: frozenset[int] | None,
          timeout_s: float = START_TIMEOUT_S) -> Server:
    """Starts ``litellm --config`` on a free loopback port, pinned to ``cores``; answers on
    return (``RuntimeError`` with its log's tail when it exits or never answers)."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="bench-litellm-")
    try:
        conf = Path(workdir) / "config.yaml"
        conf.write_text(yaml.safe_dump(config(backend_url)), encoding="utf-8")
        logs = Path(workdir) / "log.json"
        logs.write_text(json.dumps(LOG_CONFIG), encoding="utf-8")
        env = {k: v for k, v in clean_env().items()
               if not k.startswith(("LITELLM_", "DATABASE_", "REDIS_", "OPENAI_"))
               and k not in ("STORE_MODEL_IN_DB", "PROMETHEUS_MULTIPROC_DIR")}
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR",
                   LITELLM_MODE="PRODUCTION", PYTHONUNBUFFERED="1")
        argv = [str(exe), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
                "--num_workers", "1", "--telemetry", "False", "--log_config", str(logs)]
        service = Service("litellm", argv, cores=cores, env=env, cwd=workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    server = Server(service.start(), port, workdir)
    try:
        service.wait_http(server.url + READY_PATH, timeout_s=timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def confirm_cache(peer: Peer, proxy_url: str, backend_url: str, body: bytes,
                  repeats: int = REPEATS) -> None:
    """Warms LiteLLM's cache with ``body``, then checks ``repeats`` identical requests are all
    answered without the backend seeing them, with the backend's embedding; ``Unavailable``
    when not (then timing it would measure something else)."""
    status, headers = fetch(proxy_url, body)
    if status != 200:
        raise Unavailable(f"its first /v1/embeddings answered {status}"
                          f"{' ' + headers['error'] if 'error' in headers else ''}")
    peer.version = headers.get("x-litellm-version", "")
    before = backend_requests(backend_url)
    answers = [_post(proxy_url, body) for _ in range(repeats)]
    seen = backend_requests(backend_url) - before
    if seen:
        raise Unavailable(f"its cache did not answer: the backend saw {seen:.0f} of "
                          f"{repeats} repeats")
    direct = _embedding(_post(backend_url, body))
    if any(not _close(_embedding(a), direct) for a in answers):
        raise Unavailable("its cached answer is not the backend's embedding")
    peer.check = (f"after one request that reached the backend, {repeats} identical ones "
                  "did not (backend_requests_total unchanged) and carried the backend's "
                  f"embedding ({len(direct)} floats)")


def backend_requests(backend_url: str) -> float:
    """``backend_requests_total`` summed over labels on the backend's ``/metrics``."""
    return sum(s.value for s in metric_samples(backend_url, {"backend_requests_total"}))


@contextlib.contextmanager
def serving(peer: Peer, backend_url: str, body: bytes, *, cores: frozenset[int] | None,
            venv: Path | None = None, python: str = sys.executable,
            install_timeout_s: float = INSTALL_TIMEOUT_S,
            start_timeout_s: float = START_TIMEOUT_S) -> Iterator[Server | None]:
    """The proxy, installed if need be, started pinned to ``cores`` and its cache confirmed
    with ``body``; ``None`` (and ``peer.reason``) when any of that fails. Stopped by PID on
    exit."""
    server: Server | None = None
    try:
        exe = install(venv or venv_dir(), python=python, timeout_s=install_timeout_s)
        server = proxy(exe, backend_url, cores=cores, timeout_s=start_timeout_s)
        confirm_cache(peer, server.url, backend_url, body)
    except (Unavailable, RuntimeError, OSError, subprocess.SubprocessError, ValueError,
            KeyError) as exc:
        peer.reason = _reason(exc)
        if server is not None:
            server.stop()
            server = None
    try:
        yield server
    finally:
        if server is not None:
            server.stop()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, Unavailable):
        return str(exc)
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if "exited early" in first or "did not answer" in first:  # Service.wait_http's message
        return f"the proxy would not start: {_one_line(first)} {_last_error(text)}".strip()
    return f"{type(exc).__name__}: {_one_line(text)}"


def _post(base_url: str, body: bytes) -> bytes:
    request = urllib.request.Request(base_url + "/v1/embeddings", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: bytes = response.read()
        return answer


def _embedding(answer: bytes) -> list[float]:
    doc = json.loads(answer)
    values = doc["data"][0]["embedding"]
    if not isinstance(values, list) or not values:
        raise ValueError("an answer without an embedding")
    return [float(v) for v in values]


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6)
                                    for x, y in zip(a, b, strict=True))


def _last_error(text: str) -> str:
    """The most telling line of a tool's output: the last ``ERROR``/exception line, else the
    last non-empty one (one line, bounded)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith(("ERROR", "error:")) or "Error" in line.split(":", 1)[0]:
            return _one_line(line)
    return _one_line(lines[-1]) if lines else "no output"


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "/")


def main() -> int:
    """``python -m bench.litellm``: install the pinned LiteLLM into the bench's cache dir now
    (``.ci/run`` does, so the live test runs there); prints the CLI's path."""
    try:
        exe = install(venv_dir())
    except Unavailable as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print(exe)
    return 0


__all__ = ["Peer", "Unavailable", "cache_root", "config", "install", "main", "serving",
           "venv_dir"]

if __name__ == "__main__":
    sys.exit(main())
