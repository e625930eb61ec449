"""Finalizing a batch: its output and error files from the recorded results, then its final
status (``completed``, ``cancelled`` or ``expired``).

Runs from a ``finalize`` queue entry, so a worker that dies mid-way has it taken over like any
other entry; it is idempotent (the files' ids derive from the batch id and are rewritten whole,
the final status is set only from ``finalizing``/``cancelling``). Every input line appears
exactly once in one of the two files, in input order: a line with no result (the batch was
cancelled or expired first) becomes an error line saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from gateway.batch.files import FileStore
from gateway.batch.inputs import InputFiles
from gateway.batch.jobs import TERMINAL, Job, JobStore
from gateway.batch.jsonl import Line, error_line
from gateway.batch.keys import output_file_id
from gateway.batch.lines import line_id
from gateway.telemetry.observer import Observer

_PAGE = 500
_UNANSWERED = {"cancelled": ("batch_cancelled", "the batch was cancelled before this request "
                                                "ran"),
               "expired": ("batch_expired", "the batch expired before this request ran")}


def _custom_id(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = data.get("custom_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class Busy(Exception):
    """Another worker is finalizing the batch now: leave this entry for later."""


class Finalizer:
    """Writes a batch's output and error files and sets its final status, one worker at a
    time per batch (a lock, extended page by page): a finalize entry delivered twice must not
    interleave two writers' pages."""

    def __init__(self, jobs: JobStore, files: FileStore, inputs: InputFiles,
                 observer: Observer, *, owner: str, lock_ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._jobs = jobs
        self._files = files
        self._inputs = inputs
        self._observer = observer
        self._clock = clock
        self._owner = owner
        self._lock_ttl_s = lock_ttl_s

    async def run(self, batch_id: str) -> None:
        """Finalize the batch if it is due; ``Busy`` while another worker finalizes it."""
        job = await self._jobs.load(batch_id)
        if job is None or job.status in TERMINAL:
            return
        if job.status == "cancelling":
            ending = "cancelled"
        elif job.status == "finalizing":
            ending = job.fields.get("ending") or "completed"
        else:  # still running: the entry came early (never written so); its end brings another
            return
        if not await self._jobs.lock(batch_id, self._owner, self._lock_ttl_s):
            raise Busy(batch_id)
        out_id, err_id = output_file_id(batch_id, "output"), output_file_id(batch_id, "errors")
        await self._files.begin_output(out_id)
        await self._files.begin_output(err_id)
        counts = {"o": [0, 0], "e": [0, 0]}  # lines, bytes
        lines: list[Line] | None = None
        for start in range(0, job.total, _PAGE):
            if not await self._jobs.lock(batch_id, self._owner, self._lock_ttl_s):
                raise Busy(batch_id)  # our lock lapsed and another worker took over
            indexes = list(range(start, min(job.total, start + _PAGE)))
            pages: dict[str, list[bytes]] = {"o": [], "e": []}
            found = await self._jobs.results(batch_id, indexes)
            for index, value in zip(indexes, found, strict=True):
                if value is None:
                    if lines is None:
                        lines = await self._inputs.lines(job.input_file_id) or []
                    value = b"e" + self._unanswered(job, ending, index, lines)
                pages[value[:1].decode()].append(value[1:])
            for kind, page in pages.items():
                if page:
                    data = b"\n".join(page) + b"\n"
                    await self._files.append_output(out_id if kind == "o" else err_id, data)
                    counts[kind][0] += len(page)
                    counts[kind][1] += len(data)
        output = await self._commit(job, out_id, "output", counts["o"])
        errors = await self._commit(job, err_id, "errors", counts["e"])
        now = int(self._clock())
        if await self._jobs.transition(
                batch_id, ("finalizing", "cancelling"), status=ending, **{f"{ending}_at": now},
                completed=counts["o"][0], failed=counts["e"][0], output_file_id=output,
                error_file_id=errors):
            await self._jobs.finished(job)
            self._observer.batch_finished(ending)

    @staticmethod
    def _unanswered(job: Job, ending: str, index: int, lines: list[Line]) -> bytes:
        code, message = _UNANSWERED.get(ending, ("batch_incomplete", "no result was recorded"))
        number, raw = lines[index] if index < len(lines) else (index + 1, b"")
        return error_line(line_id(job.id, index), _custom_id(raw), code, message, number)

    async def _commit(self, job: Job, file_id: str, kind: str, count: list[int]) -> str:
        """The file's id once its metadata is stored; "" (and no file) when it has no lines."""
        if not count[0]:
            await self._files.blobs.delete(file_id)
            return ""
        await self._files.commit_output(job.tenant, file_id, f"{job.id}_{kind}.jsonl",
                                        count[1], count[0])
        return file_id
