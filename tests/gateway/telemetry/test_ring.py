"""Where history points live: memory, and segment files the host's workers share."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gateway.telemetry.ring import FileRing, HostLock, MemoryRing
from tests.conftest import REPO


def pt(t: float) -> dict[str, object]:
    return {"t": t, "dt": 1.0, "requests": {"HIT": t}}


def test_memory_ring_is_bounded_and_answers_what_is_newer() -> None:
    ring = MemoryRing(5)
    for t in range(1, 9):
        ring.append(pt(t))
    assert len(ring) == 5
    assert [p["t"] for p in ring.since(0)] == [4, 5, 6, 7, 8]
    assert [p["t"] for p in ring.since(6)] == [7, 8]
    assert ring.since(8) == []


def test_a_reader_sees_what_the_writer_appends(tmp_path: Path) -> None:
    writer, reader = FileRing(tmp_path, 10), FileRing(tmp_path, 10)
    reader.refresh()
    assert reader.since(0) == []
    for t in (1, 2, 3):
        writer.append(pt(t))
    reader.refresh()
    assert reader.since(0) == [pt(1), pt(2), pt(3)]
    writer.append(pt(4))
    reader.refresh()  # reads only the new line
    assert [p["t"] for p in reader.since(2)] == [3, 4]


def test_files_stay_bounded_and_readers_keep_the_window(tmp_path: Path) -> None:
    writer, reader = FileRing(tmp_path, 10), FileRing(tmp_path, 10)
    late = FileRing(tmp_path, 10)  # first looks after many segments were written and removed
    for t in range(1, 48):
        writer.append(pt(t))
        if t % 3 == 0:
            reader.refresh()
    reader.refresh()
    late.refresh()
    segments = sorted(p.name for p in tmp_path.glob("points.*.jsonl"))
    assert len(segments) == 3  # 5 points each: between 10 and 15 on disk
    lines = sum(len((tmp_path / s).read_bytes().splitlines()) for s in segments)
    assert 10 <= lines <= 15
    expected = [pt(t) for t in range(38, 48)]
    assert reader.since(0) == expected and late.since(0) == expected
    assert writer.since(0) == expected


def test_a_new_writer_continues_after_a_line_cut_short(tmp_path: Path) -> None:
    first = FileRing(tmp_path, 10)
    first.append(pt(1))
    first.append(pt(2))
    [segment] = tmp_path.glob("points.*.jsonl")
    with open(segment, "ab") as f:
        f.write(b'{"t": 3, "dt": 1.0, "requ')  # the writer died mid-line
    second = FileRing(tmp_path, 10)
    second.refresh()  # what a worker does when it takes the lock
    assert second.since(0) == [pt(1), pt(2)]
    second.append(pt(4))
    second.append(pt(5))
    reader = FileRing(tmp_path, 10)
    reader.refresh()
    assert reader.since(0) == [pt(1), pt(2), pt(4), pt(5)]


def test_one_lock_holder_at_a_time(tmp_path: Path) -> None:
    a, b = HostLock(tmp_path / "sampler.lock"), HostLock(tmp_path / "sampler.lock")
    assert a.try_acquire() and a.held
    assert not b.try_acquire() and not b.held
    a.release()
    assert b.try_acquire()
    b.release()


_HOLD = """
import sys, time
from pathlib import Path
from gateway.telemetry.ring import HostLock
assert HostLock(Path(sys.argv[1])).try_acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_the_lock_of_a_dead_holder_is_free(tmp_path: Path) -> None:
    path = tmp_path / "sampler.lock"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], cwd=REPO,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        mine = HostLock(path)
        assert not mine.try_acquire()
        assert mine.holder() == proc.pid
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while not mine.try_acquire() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mine.held and mine.holder() is not None
    mine.release()
