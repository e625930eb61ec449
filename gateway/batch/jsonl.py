"""The JSONL of batch files: splitting and checking an input file, and the output/error lines.

Input lines (OpenAI's shape)::

    {"custom_id": "req-1", "method": "POST", "url": "/v1/embeddings", "body": {...}}

Output lines, one per input line, in the output file (2xx) or the error file (everything else)::

    {"id": "batch_req_...", "custom_id": "req-1",
     "response": {"status_code": 200, "request_id": "...", "body": {...}}, "error": null}
    {"id": "batch_req_...", "custom_id": "req-2", "response": null,
     "error": {"code": "invalid_request_line", "message": "...", "line": 2}}

Upload checks what must hold for the whole file (sizes, line count, unique ``custom_id``s);
a line that is not a valid request is accepted and becomes an error line when the batch runs,
so one bad line never fails the batch.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import PayloadTooLarge, ValidationFailed

Line = tuple[int, bytes]
"""(1-based line number in the file, the line's bytes)."""


def split_lines(data: bytes) -> list[Line]:
    """The file's requests: its non-blank lines with their line numbers."""
    return [(n, raw) for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()]


def check_upload(data: bytes, *, max_lines: int, max_line_bytes: int) -> int:
    """The number of requests in an input file, or the 4xx that refuses it: 413 for a line or
    a line count over the limits, 422 for a file without requests or a repeated custom_id."""
    lines = split_lines(data)
    if not lines:
        raise ValidationFailed("file", "has no requests (one JSON object per line)")
    if len(lines) > max_lines:
        raise PayloadTooLarge(f"file has {len(lines)} requests; limit {max_lines} "
                              "(batch.max_lines)")
    seen: dict[str, int] = {}
    for number, raw in lines:
        if len(raw) > max_line_bytes:
            raise PayloadTooLarge(f"file line {number} is {len(raw)} bytes; limit "
                                  f"{max_line_bytes} (batch.max_line_bytes)")
        custom_id = _custom_id(raw)
        if custom_id is not None:
            first = seen.setdefault(custom_id, number)
            if first != number:
                raise ValidationFailed("file", f"line {number} repeats the custom_id of line "
                                               f"{first}; each request needs its own")
    return len(lines)


def _custom_id(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = data.get("custom_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def parse_request(raw: bytes, number: int, endpoint: str) -> tuple[str, dict[str, Any]]:
    """(custom_id, body) of one input line; ``BadLine`` when it is not a request for
    ``endpoint``."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadLine(None, f"line {number}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadLine(None, f"line {number}: must be a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BadLine(None, f"line {number}: custom_id must be a non-empty string")
    extra = sorted(set(data) - {"custom_id", "method", "url", "body"})
    if extra:
        raise BadLine(custom_id, f"line {number}: unknown field(s) {', '.join(extra)}")
    if data.get("method") != "POST":
        raise BadLine(custom_id, f"line {number}: method must be POST")
    url = data.get("url")
    if url != endpoint:
        raise BadLine(custom_id, f"line {number}: url must be the batch's endpoint {endpoint} "
                                 f"(got {url!r})")
    body = data.get("body")
    if not isinstance(body, dict):
        raise BadLine(custom_id, f"line {number}: body must be a JSON object")
    return custom_id, body


class BadLine(Exception):
    """An input line that is not a valid request: it becomes an error line."""

    def __init__(self, custom_id: str | None, message: str) -> None:
        super().__init__(message)
        self.custom_id = custom_id
        self.message = message


def response_line(line_id: str, custom_id: str, status: int, request_id: str,
                  body: bytes) -> bytes:
    """An output or error line carrying a response (``body`` is already JSON)."""
    return orjson.dumps({"id": line_id, "custom_id": custom_id, "response": {
        "status_code": status, "request_id": request_id, "body": orjson.Fragment(body)},
        "error": None})


def error_line(line_id: str, custom_id: str | None, code: str, message: str,
               number: int) -> bytes:
    """An error line for a request that never got a response."""
    return orjson.dumps({"id": line_id, "custom_id": custom_id, "response": None,
                         "error": {"code": code, "message": message, "line": number}})
