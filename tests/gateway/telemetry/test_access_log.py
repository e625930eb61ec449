"""The access log: JSON lines written in batches, by mode, never with request text."""

from __future__ import annotations

import io

import orjson
import pytest

from gateway.telemetry.access_log import AccessLog


def lines(stream: io.BytesIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_lines_are_batched_and_shaped_like_every_log_line() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, mode="all", max_pending=10)
    for i in range(9):
        log.record(f"r{i}", "POST", "/v1/embeddings", 200, "HIT", "acme", 0.5, "total;dur=0.5")
    assert stream.getvalue() == b"", "nothing is written per request"
    log.record("r9", "POST", "/v1/embeddings", 200, "HIT", "acme", 0.5, "total;dur=0.5")
    got = lines(stream)
    assert len(got) == 10, "the tenth line flushed the batch in one write"
    first = got[0]
    assert first["logger"] == "gateway.access" and first["level"] == "info"
    assert first["msg"] == "request" and first["request_id"] == "r0"
    assert {"ts", "method", "route", "status", "cache", "tenant", "duration_ms",
            "timing"} <= set(first)
    assert str(first["ts"]).endswith("Z")


@pytest.mark.parametrize(("mode", "expected"), [
    ("all", ["ok", "error", "slow"]),
    ("errors", ["error", "slow"]),
    ("off", []),
])
def test_modes(mode: str, expected: list[str]) -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, mode=mode, slow_ms=100.0)
    log.record("ok", "POST", "/v1/rank", 200, "MISS", "t", 5.0, "")
    log.record("error", "POST", "/v1/rank", 503, "NONE", "t", 5.0, "")
    log.record("slow", "POST", "/v1/rank", 200, "MISS", "t", 250.0, "")
    log.flush()
    assert [line["request_id"] for line in lines(stream)] == expected


def test_sampled_keeps_a_share_of_successes_and_every_error() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, mode="sampled", sample=0.1)
    values = iter([0.05, 0.5, 0.95, 0.01])
    log._random = lambda: next(values)
    for i in range(4):
        log.record(f"ok{i}", "POST", "/v1/embeddings", 200, "HIT", "t", 1.0, "")
    log.record("bad", "POST", "/v1/embeddings", 422, "NONE", "t", 1.0, "")
    log.flush()
    assert [line["request_id"] for line in lines(stream)] == ["ok0", "ok3", "bad"]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="access log mode"):
        AccessLog(io.BytesIO(), mode="verbose")


def test_lines_escape_what_json_must_and_parse_back() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, mode="all")
    log.record('a"b\\c', "POST", "/v1/rank", 200, "HIT", 'ten"ant\n', 2.0004, "total;dur=2.000")
    log.flush()
    (line,) = lines(stream)
    assert line["request_id"] == 'a"b\\c' and line["tenant"] == 'ten"ant\n'
    assert line["duration_ms"] == 2.0 and line["status"] == 200
