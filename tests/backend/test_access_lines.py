"""The access log's kept lines: the formatter's JSON, written in one call per interval, at
``max_pending``, at shutdown, and through ``logging`` where no stream was configured."""

from __future__ import annotations

import asyncio
import io
import logging

import orjson
import pytest

from backend.logs import AccessLines, JsonFormatter


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def lines_of(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_is_what_the_json_formatter_writes_for_the_same_record() -> None:
    lines = AccessLines()
    lines.stream = stream = CountingStream()
    fields = {"request_id": "r1", "method": "POST", "path": "/v2/models/m/infer",
              "status": 200, "duration_ms": 1.25, "model": "m"}
    lines.write(logging.INFO, dict(fields))  # no running loop: written at once
    (line,) = stream.getvalue().splitlines()
    record = logging.LogRecord("backend.access", logging.INFO, __file__, 1, "request", None,
                               None)
    record.fields = fields
    record.created = 0.0
    expected = orjson.loads(JsonFormatter().format(record))
    got = orjson.loads(line)
    assert list(got) == list(expected)  # same keys, same order
    assert {**got, "ts": None} == {**expected, "ts": None}
    assert str(got["ts"]).endswith("+00:00")


async def test_lines_are_kept_and_written_together_once_the_interval_passes() -> None:
    lines = AccessLines(interval_s=0.05)
    lines.stream = stream = CountingStream()
    for i in range(5):
        lines.write(logging.INFO, {"request_id": f"r{i}"})
    assert stream.writes == 0
    await asyncio.sleep(0.15)
    assert stream.writes == 1
    assert [line["request_id"] for line in lines_of(stream)] == [f"r{i}" for i in range(5)]
    lines.write(logging.DEBUG, {"request_id": "quiet"})  # a probe's line keeps its level
    lines.flush()
    assert lines_of(stream)[-1]["level"] == "debug" and stream.writes == 2


async def test_a_full_buffer_is_written_at_once() -> None:
    lines = AccessLines(interval_s=60.0, max_pending=3)
    lines.stream = stream = CountingStream()
    for i in range(7):
        lines.write(logging.INFO, {"request_id": f"r{i}"})
    assert stream.writes == 2 and len(lines_of(stream)) == 6
    lines.flush()  # what shutdown does
    assert len(lines_of(stream)) == 7 and stream.writes == 3


def test_a_new_loop_gets_its_own_timer() -> None:
    lines = AccessLines(interval_s=0.5)
    lines.stream = stream = CountingStream()

    async def one(rid: str, wait_s: float) -> None:
        lines.write(logging.INFO, {"request_id": rid})
        await asyncio.sleep(wait_s)

    asyncio.run(one("a", 0.0))  # the loop ends before its timer fires: the timer goes with it
    assert stream.getvalue() == ""
    asyncio.run(one("b", 1.0))  # a timer on this loop writes both
    assert [line["request_id"] for line in lines_of(stream)] == ["a", "b"]


def test_without_a_configured_stream_each_line_goes_through_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = AccessLines()
    with caplog.at_level(logging.INFO, logger="backend.access"):
        lines.write(logging.INFO, {"request_id": "r1"})
    (record,) = [r for r in caplog.records if r.name == "backend.access"]
    assert record.getMessage() == "request" and record.fields == {"request_id": "r1"}  # type: ignore[attr-defined]
