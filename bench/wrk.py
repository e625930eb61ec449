"""Driving ``wrk`` (the OS package) for POST benchmarks, with results read back as numbers.

A Python load generator tops out at a few thousand requests per second per core, below what a
cache hit costs the servers compared here, so throughput runs use wrk. The Lua script is
written per run: one fixed body (``wrk.body``, the cheapest path) or a list of bodies sent in
turn, pre-formatted in ``init`` so the per-request Lua work is a table lookup. Its ``done`` hook
prints one ``WRKJSON {...}`` line (requests, duration, errors, latency percentiles in
microseconds), so nothing depends on wrk's human-readable text.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.procs import pinned

MARK = "WRKJSON "
PERCENTILES = (50, 90, 99, 99.9)

_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, '
    .. '"write": %d, "status": %d, "timeout": %d, "p50": %d, "p90": %d, "p99": %d, '
    .. '"p999": %d, "mean": %.1f}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.mean))
end
"""


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run; latencies in milliseconds."""

    requests: int
    duration_s: float
    errors: int  # connect, read, write and timeout errors
    non_2xx: int  # answers with a status outside 2xx/3xx
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float
    bytes_read: int

    @property
    def rps(self) -> float:
        """Requests answered per second (only a run with no errors or non-2xx is clean)."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def clean(self) -> bool:
        """No transport errors and no non-2xx answers."""
        return self.errors == 0 and self.non_2xx == 0


def lua_string(text: str) -> str:
    """A Lua long-bracket literal for ``text`` (a level no line of ``text`` closes)."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[{text}]{eq}]"


def script(path: str, bodies: Sequence[bytes], headers: Mapping[str, str]) -> str:
    """A wrk Lua script that POSTs ``bodies`` to ``path`` (in turn when several)."""
    if not bodies:
        raise ValueError("at least one body is required")
    hdrs = ", ".join(f"[ {lua_string(k)} ] = {lua_string(v)}" for k, v in headers.items())
    lines = [f"local headers = {{{hdrs}}}", f"local path = {lua_string(path)}"]
    if len(bodies) == 1:
        lines += [
            'wrk.method = "POST"',
            f"wrk.body = {lua_string(bodies[0].decode())}",
            "for k, v in pairs(headers) do wrk.headers[k] = v end",
            "wrk.path = path",
        ]
    else:
        literals = ",\n  ".join(lua_string(b.decode()) for b in bodies)
        lines += [
            f"local bodies = {{\n  {literals}\n}}",
            "local reqs = {}",
            "local n = 0",
            "init = function(args)",
            "  for i, b in ipairs(bodies) do reqs[i] = wrk.format('POST', path, headers, b) end",
            "  n = #reqs",
            "end",
            "local i = 0",
            "request = function()",
            "  i = i % n + 1",
            "  return reqs[i]",
            "end",
        ]
    return "\n".join(lines) + "\n" + _DONE


def available() -> bool:
    """True when a ``wrk`` binary is on PATH."""
    return shutil.which("wrk") is not None


def run(
    base_url: str,
    path: str,
    bodies: Sequence[bytes],
    *,
    headers: Mapping[str, str],
    connections: int,
    duration_s: float,
    cores: frozenset[int],
    threads: int = 1,
    timeout_s: float = 5.0,
) -> WrkResult:
    """Runs wrk pinned to ``cores`` for ``duration_s`` (it stops itself; the subprocess is
    also bounded by a timeout) and returns its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        lua = Path(tmp) / "post.lua"
        lua.write_text(script(path, bodies, headers), encoding="utf-8")
        argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s",
                f"--timeout={max(1, round(timeout_s))}s", "-s", str(lua), base_url + path]
        with pinned(cores):
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=duration_s + timeout_s + 30)
    return parse(done.stdout, done.stderr)


def parse(stdout: str, stderr: str = "") -> WrkResult:
    """The ``WRKJSON`` line of a run's output as a ``WrkResult``."""
    for line in stdout.splitlines():
        if line.startswith(MARK):
            doc = json.loads(line[len(MARK):])
            return WrkResult(
                requests=int(doc["requests"]),
                duration_s=doc["duration_us"] / 1e6,
                errors=int(doc["connect"] + doc["read"] + doc["write"] + doc["timeout"]),
                non_2xx=int(doc["status"]),
                p50_ms=doc["p50"] / 1000.0,
                p90_ms=doc["p90"] / 1000.0,
                p99_ms=doc["p99"] / 1000.0,
                p999_ms=doc["p999"] / 1000.0,
                mean_ms=doc["mean"] / 1000.0,
                bytes_read=int(doc["bytes"]),
            )
    raise RuntimeError(f"wrk printed no results:\n{stdout[-800:]}\n{stderr[-800:]}")
