"""The parser-failure mapping both services share (oip/parse_errors.py)."""

from __future__ import annotations

from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong

from oip.parse_errors import TOO_MANY_HEADERS, parse_failure

LIMITS = {"max_line_size": 8190, "max_field_size": 16384, "max_headers": 128}


def test_the_request_line_over_its_limit_is_414_and_a_header_431() -> None:
    url = parse_failure(LineTooLong("GET /?key=secret...", 8190, 9000), **LIMITS,
                        first_request=False)
    assert (url.status, url.message) == (414, "the request line is longer than 8190 bytes")
    header = parse_failure(LineTooLong("X-Key: secret...", 16384, 20000), **LIMITS,
                           first_request=False)
    assert (header.status, header.message) == (431, "a request header is longer than 16384 bytes")
    assert "secret" not in url.message + header.message


def test_too_many_headers_is_431_and_anything_else_400() -> None:
    many = parse_failure(BadHttpMessage(TOO_MANY_HEADERS), **LIMITS, first_request=False)
    assert (many.status, many.message) == (431, "more than 128 request headers")
    junk = parse_failure(BadHttpMessage("invalid character"), **LIMITS, first_request=False)
    assert (junk.status, junk.quiet) == (400, False)


def test_a_scanners_first_request_is_quiet() -> None:
    assert parse_failure(BadHttpMethod("\x16\x03\x01"), **LIMITS, first_request=True).quiet
    assert not parse_failure(BadHttpMethod("\x16\x03\x01"), **LIMITS, first_request=False).quiet
