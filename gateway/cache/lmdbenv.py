"""Opening the node tier's LMDB environment: once per directory and process, fsync-free but
never trusted across a machine crash.

Commits skip fsync (``MDB_NOSYNC``): a commit then costs microseconds instead of a disk flush
(2.8 ms per commit on the reference machine), so another worker sees a new entry at once and a
stream of misses does not turn into a stream of flushes. That is safe against a *process*
dying at any point, a worker killed mid-write included: LMDB commits by writing its meta page
last, and whatever a process wrote is in the kernel's page cache, which outlives it. Only a
*machine* crash could leave pages on disk out of order (a torn file). So the directory records
the boot it was written under (``/proc/sys/kernel/random/boot_id``); the first process to open it
after the host restarted finds another boot and starts the tier empty instead of reading a file
that may be torn. Where the boot cannot be known (not Linux), commits fsync instead.

LMDB never shrinks its data file, so a process that finds itself alone with a directory larger
than its ``max_bytes`` (the setting was lowered) starts it afresh too. Each process holds a shared
``flock`` on ``users.lock`` while it has the directory open, which is how "alone" is known.

LMDB must not be opened twice by one process (closing one handle would drop the locks the other
relies on), so environments are shared per real path, with their users counted.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import IO

import lmdb

log = logging.getLogger(__name__)

#: Readers one directory accepts at once: each process holds about one slot while it reads, so
#: this covers far more workers than a host runs.
MAX_READERS = 1024
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_FILES = ("data.mdb", "lock.mdb")


class _Shared:
    """One open environment per directory and process: the env, its users in this process, and
    the file this process holds a shared lock on while it has the directory open."""

    lock = threading.Lock()
    envs: dict[str, tuple[lmdb.Environment, int, IO[str]]] = {}


def boot_id() -> str | None:
    """This boot's id, or None where the system does not say."""
    try:
        return BOOT_ID.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def open_env(path: str, map_size: int) -> lmdb.Environment:
    """The environment in ``path`` (created if missing), shared within this process."""
    real = os.path.realpath(path)
    with _Shared.lock:
        found = _Shared.envs.get(real)
        if found is not None:
            _Shared.envs[real] = (found[0], found[1] + 1, found[2])
            return found[0]
        os.makedirs(real, mode=0o700, exist_ok=True)
        boot = boot_id()
        users = open(os.path.join(real, "users.lock"), "a")  # noqa: SIM115 (held while open)
        try:
            # Opens are serialised across processes: the first one after a reboot, or the only
            # one, may start the directory afresh before anybody maps it.
            with open(os.path.join(real, "open.lock"), "a") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                if boot is not None:
                    _forget_other_boots(real, boot)
                if _alone(users):
                    _shrink_alone(real, map_size)
                # readahead off: lookups are random, and a map bigger than RAM must not evict
                # the hot set; meminit off: pages are written whole before they are read.
                env = lmdb.open(real, map_size=map_size, subdir=True, max_dbs=8,
                                max_readers=MAX_READERS, sync=boot is None, metasync=False,
                                readahead=False, meminit=False, lock=True)
                fcntl.flock(users, fcntl.LOCK_SH)
        except BaseException:
            users.close()
            raise
        _Shared.envs[real] = (env, 1, users)
        return env


def _alone(users: IO[str]) -> bool:
    """True when no other process has the directory open (each holds ``users.lock`` shared)."""
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _shrink_alone(real: str, map_size: int) -> None:
    """LMDB never shrinks its file, and a map smaller than the data in it cannot even make room
    (a rotation needs free pages): with ``max_bytes`` lowered, start the directory afresh."""
    data = Path(real, "data.mdb")
    if data.exists() and data.stat().st_size > map_size:
        log.info("node cache: %s is larger than cache.node.max_bytes now; starting it empty",
                 real)
        for name in _FILES:
            Path(real, name).unlink(missing_ok=True)


def _forget_other_boots(real: str, boot: str) -> None:
    mark = Path(real, "boot_id")
    try:
        written = mark.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        written = None
    if written == boot:
        return
    if written is not None or any(Path(real, f).exists() for f in _FILES):
        log.info("node cache: %s was written before this host restarted; starting it empty",
                 real)
    for name in _FILES:
        Path(real, name).unlink(missing_ok=True)
    tmp = mark.with_suffix(".tmp")
    tmp.write_text(boot, encoding="ascii")
    os.replace(tmp, mark)


def close_env(env: lmdb.Environment) -> None:
    """Release one user of ``env``; the last one closes it."""
    with _Shared.lock:
        for real, (found, users, held) in list(_Shared.envs.items()):
            if found is env:
                if users > 1:
                    _Shared.envs[real] = (found, users - 1, held)
                    return
                del _Shared.envs[real]
                env.close()
                held.close()  # drops this process's shared lock
                return
    env.close()
