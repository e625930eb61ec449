"""Child processes for the benchmarks: pinned to CPU cores, logged to a file, stopped by PID.

Every server a benchmark starts (backend, gateway, nginx, redis, fakes) is a ``Service``: a
command started with its CPU affinity set before ``exec`` (so every thread and child it makes
stays on those cores), its stdout and stderr in a temporary log, and a ``stop`` that signals
exactly that PID (then SIGKILL if it lingers). Use it as a context manager so a failed run
still stops it. ``Cores`` splits the machine into the server's core and the load generator's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class Cores:
    """Which CPUs the server under test gets and which the load generator gets."""

    server: frozenset[int]
    client: frozenset[int]

    @property
    def pinned(self) -> bool:
        """True when server and client have separate cores."""
        return not self.server & self.client

    def describe(self) -> str:
        """``server on CPU {0}, load generator on CPU {1}`` (or the unpinned note)."""
        if not self.pinned:
            return f"unpinned: every CPU ({_fmt(self.server)}) for everything"
        return f"server on CPU {_fmt(self.server)}, load generator on CPU {_fmt(self.client)}"


def split_cores() -> Cores:
    """The first usable CPU for the server, the last for the client (all CPUs on 1 core)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        every = frozenset(cores)
        return Cores(every, every)
    return Cores(frozenset(cores[:1]), frozenset(cores[-1:]))


@contextlib.contextmanager
def pinned(cores: frozenset[int]) -> Iterator[None]:
    """Runs the block (this process's thread) on ``cores``."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Service:
    """One child process: started pinned to ``cores``, logged, stopped by its PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cores: frozenset[int] | None = None,
        env: Mapping[str, str] | None = None,
        stop_signal: int = signal.SIGTERM,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.cores = cores
        self.env = dict(env) if env is not None else None
        self.stop_signal = stop_signal
        self.cwd = cwd
        # Closed (and deleted) in stop(), which owns the process the file logs.
        self._log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log")  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The child's PID (raises before start)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc.pid

    def start(self) -> Service:
        """Starts the command (affinity set in the parent around the fork, so it is inherited
        before ``exec``: no ``preexec_fn`` needed)."""
        context = pinned(self.cores) if self.cores is not None else contextlib.nullcontext()
        with context:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd,
            )
        return self

    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Signals the child's PID, waits, then SIGKILLs that same PID if it lingers."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, self.stop_signal)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._log.close()

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the child's output."""
        self._log.flush()
        with contextlib.suppress(OSError):
            text = Path(self._log.name).read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def wait_http(self, url: str, *, timeout_s: float = 60.0, status: int | None = 200) -> None:
        """Polls ``url`` (GET) until it answers ``status`` (None: any status); raises with the
        log's tail if the child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            got = http_status(url)
            if got == status or (status is None and got != 0):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer {url} with {status or 'any'} after "
                           f"{timeout_s:g} s:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by the child and its own children (nginx's
        workers), every thread of each."""
        if self.proc is None:
            return 0.0
        return sum(_cpu_of(pid) for pid in (self.proc.pid, *_children(self.proc.pid)))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _cpu_of(pid: int) -> float:
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent busy since boot (``/proc/stat``): the
    delta over a run, minus what the measured processes used, is what *other* processes took
    on a shared machine."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        ticks = _cpu_ticks()
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return 0.0


Mark = tuple[float, float, float]
"""(the machine's busy CPU seconds, the measured processes' CPU seconds, the monotonic time)."""


def cpu_mark(ours: Sequence[Service] = ()) -> Mark:
    """A mark for ``other_cores``: ``ours`` are the services measured, with this process."""
    return (busy_seconds(), sum(s.cpu_seconds() for s in ours) + time.process_time(),
            time.monotonic())


def other_cores(before: Mark, after: Mark) -> float:
    """Cores other processes held between two marks: the machine's busy time less ours."""
    wall = after[2] - before[2]
    if wall <= 0:
        return 0.0
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


class Meter:
    """Cores other processes used between ``start`` and ``stop`` (``other_cores`` of two marks;
    ``ours``: the services measured, besides this process)."""

    def __init__(self, ours: Sequence[Service] = ()) -> None:
        self.ours = ours
        self._mark = cpu_mark(ours)

    def start(self) -> None:
        self._mark = cpu_mark(self.ours)

    def stop(self) -> float:
        return other_cores(self._mark, cpu_mark(self.ours))


def steal_seconds() -> float:
    """CPU seconds the hypervisor has given to other guests since boot (``/proc/stat``'s steal
    column, summed over CPUs): time this VM wanted to run and could not."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return _cpu_ticks()[7] / os.sysconf("SC_CLK_TCK")
    return 0.0


def _cpu_ticks() -> list[int]:
    """The machine-wide ``cpu`` line of ``/proc/stat``: user, nice, system, idle, iowait, irq,
    softirq, steal, ... in clock ticks."""
    return [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def http_status(url: str, timeout_s: float = 1.0) -> int:
    """The HTTP status of a GET on a loopback ``url`` (0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``GATEWAY_*`` variable, plus ``extra``: a
    benchmark's gateway settings come from the benchmark, not from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(extra)
    return env


def _fmt(cores: frozenset[int]) -> str:
    return "{" + ",".join(map(str, sorted(cores))) + "}"
