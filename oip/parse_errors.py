"""What an aiohttp request-parser failure stands for, the same in both services.

aiohttp calls a request handler's ``handle_error`` for a request it could not parse. What that
failure means does not depend on the service: a request line over the parser's limit is 414, a
header over it or too many headers is 431, anything else (not HTTP/1.1) is 400. Each service
renders the answer in its own error shape. The message never quotes the request (aiohttp's own
does, which would log an API key sent in a query string).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, LineTooLong

TOO_MANY_HEADERS = "Too many headers received"  # aiohttp's BadHttpMessage text for max_headers


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """The answer a parser failure calls for."""

    status: int
    """400, 414 or 431."""
    message: str
    """What was wrong, never the request's own bytes."""
    quiet: bool
    """A scanner's junk (TLS, a binary probe) as a connection's first request: log at DEBUG."""


def parse_failure(exc: HttpProcessingError, *, max_line_size: int, max_field_size: int,
                  max_headers: int, first_request: bool) -> ParseFailure:
    """The failure ``exc`` stands for under the handler's limits."""
    quiet = first_request and isinstance(exc, BadHttpMethod)
    if isinstance(exc, LineTooLong):
        # LineTooLong carries (line, limit, ...): the limit tells the request line (URL) from a
        # header, as long as the two limits differ (both services set them apart).
        limit = exc.args[1] if len(exc.args) > 1 else None
        if limit == max_line_size and limit != max_field_size:
            return ParseFailure(414, f"the request line is longer than {limit} bytes", quiet)
        return ParseFailure(431, f"a request header is longer than {limit} bytes", quiet)
    if exc.message == TOO_MANY_HEADERS:
        return ParseFailure(431, f"more than {max_headers} request headers", quiet)
    return ParseFailure(400, "the request is not valid HTTP/1.1", quiet)
