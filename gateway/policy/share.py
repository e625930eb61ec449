"""The last good policy of one gateway, shared by all its workers through a folder.

Each worker of a gateway (``server.py`` starts several) watches the policy files itself, and
the admin reload reaches only the worker that took the connection. Read independently, a
valid edit followed quickly by an invalid one let workers settle on different versions: the
one that read in between kept the new policy, the others refused the invalid file and kept the
old. So every read happens under one lock, and a read that loads is published here, as the
texts it loaded (``current.json``: a generation number, a digest and the files' texts):

- a worker reads the files only while holding the lock (``flock`` on ``lock``), and publishes
  what loaded before letting go, so publications follow the order of the reads;
- a worker whose read is refused (an invalid file) adopts the published texts, not its own
  last good policy: the last *valid read of any worker* stays, everywhere;
- every worker polls ``current.json`` and adopts a new generation (the same texts always load
  as the same policy, version included).
After a reload settles every worker therefore serves the texts of the last valid read. The
folder is made by the supervisor for one run (``server.supervise``) and removed with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from gateway.policy.loader import Source

_CURRENT = "current.json"


@dataclass(frozen=True, slots=True)
class Published:
    """One publication: what a worker read and loaded, in load order."""

    generation: int
    digest: str
    sources: tuple[Source, ...]


def digest_of(sources: Sequence[Source]) -> str:
    """A content hash of policy texts (names included: they appear in messages and origins)."""
    h = hashlib.sha256()
    for name, text in sources:
        for part in (name, text):
            raw = part.encode("utf-8")
            h.update(len(raw).to_bytes(8, "little") + raw)
    return h.hexdigest()


class PolicyShare:
    """The shared folder: a lock for reads and the current publication."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._current = self.folder / _CURRENT

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the gateway-wide read lock (blocking: call it off the event loop)."""
        self.folder.mkdir(parents=True, exist_ok=True)  # a tmp cleaner may have removed it
        fd = os.open(self.folder / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def stamp(self) -> tuple[int, int, int] | None:
        """Cheap change detection for polling: the publication file's identity and size."""
        try:
            st = self._current.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def read(self) -> Published | None:
        """The current publication, or None before the first."""
        try:
            doc = orjson.loads(self._current.read_bytes())
        except FileNotFoundError:
            return None
        return Published(int(doc["generation"]), str(doc["digest"]),
                         tuple((str(n), str(t)) for n, t in doc["sources"]))

    def publish(self, sources: Sequence[Source]) -> Published:
        """Make ``sources`` current (under ``locked``); the same texts as now publish nothing."""
        digest = digest_of(sources)
        now = self.read()
        if now is not None and now.digest == digest:
            return now
        new = Published((now.generation + 1) if now is not None else 1, digest, tuple(sources))
        tmp = self.folder / f".{_CURRENT}.{os.getpid()}"
        tmp.write_bytes(orjson.dumps({"generation": new.generation, "digest": digest,
                                      "sources": [list(s) for s in sources]}))
        os.replace(tmp, self._current)  # atomic: a reader sees the old file or the new one
        return new
