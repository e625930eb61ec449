"""IP addresses: IPv4 in the notations resolvers accept, and IPv6.

IPv4 anywhere: dotted quads with decimal, zero-padded or octal (``0177.0.0.1``) or hex
(``0x7f.0.0.1``) parts. Shorter forms (``127.1``) and a single 32-bit number (``2130706433``,
``0x7f000001``) only as the host of a URL (``http://2130706433/``): anywhere else they are
ordinary numbers.
"""

from __future__ import annotations

import ipaddress
import re

from gateway.policy.shape import Shape, Span, number_after, word_before

_A = re.ASCII
# Three dots with a number between: a literal prefix, so the regex engine finds "." at C speed.
_V4_HINT = re.compile(r"\.[0-9A-Fa-fxX]{1,4}\.[0-9A-Fa-fxX]{1,4}\.[0-9]")
_PART = r"(?:0[xX][0-9A-Fa-f]{1,2}|[0-9]{1,4})"
_V4 = re.compile(rf"{_PART}(?:\.{_PART}){{3}}", _A)
_HEX_PART = frozenset("0123456789abcdefABCDEFxX")
_V6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_V6_TAIL = re.compile(r"(?:[0-9A-Fa-f]{0,4}:)*(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9])"
                      r"|[0-9A-Fa-f]{0,4})", _A)
_HEX_COLON = frozenset("0123456789abcdefABCDEF:")
_URL_HOST = re.compile(r"(?:[^\s/?#@]*@)?([0-9A-Fa-fxX.]+)(?=[/:?#\s]|\Z)", _A)


def _number(part: str) -> int | None:
    """One part as ``inet_aton`` reads it: ``0x`` hex, a leading ``0`` octal, else decimal."""
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    try:
        return int(digits, base) if digits else None
    except ValueError:
        return None


def _dotted_quad(candidate: str) -> bool:
    """Four parts of at most one byte each (a zero-padded part may read as decimal or octal)."""
    for part in candidate.split("."):
        value = _number(part)
        if part.isdigit() and len(part) <= 3 and int(part) <= 255:
            continue  # decimal, perhaps zero-padded ("010" is 10 or 8: an address either way)
        if value is None or value > 255:
            return False
    return True


def inet_aton_valid(host: str) -> bool:
    """Whether ``host`` is an IPv4 address as ``inet_aton`` reads it: 1-4 parts, the last one
    filling the remaining bytes (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``)."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return False
    values = [_number(p) for p in parts]
    if any(v is None for v in values):
        return False
    *head, last = values
    return all(v is not None and v <= 255 for v in head) and \
        last is not None and last < 256 ** (5 - len(parts))


def ipv4s(s: Shape, out: list[Span]) -> None:
    """Append dotted-quad IPv4 addresses (decimal, octal or hex parts)."""
    text = s.plain
    starts: list[int] = []
    for hint in _V4_HINT.finditer(text):
        i = hint.start()
        while i > 0 and text[i - 1] in _HEX_PART and hint.start() - i < 4:
            i -= 1
        if i < hint.start():
            starts.append(i)
    end = -1
    for i in sorted(set(starts)):
        if i < end or word_before(text, i, "."):
            continue
        m = _V4.match(text, i)
        if m is None or number_after(text, m.end()) or not _dotted_quad(m.group()):
            continue
        if m.group() == "0.0.0.0":  # "listen on 0.0.0.0": every address, nobody's
            continue
        end = m.end()
        out.append(("ip", i, end))


def url_hosts(s: Shape, out: list[Span]) -> None:
    """Append numeric URL hosts in any ``inet_aton`` notation (``http://0x7f000001/``)."""
    text = s.plain
    for i in s.urls:
        m = _URL_HOST.match(text, i + 3)
        if m is not None and inet_aton_valid(m.group(1)):
            out.append(("ip", m.start(1), m.end(1)))


def ipv6s(s: Shape, out: list[Span]) -> None:
    """Append IPv6 addresses (validated by ``ipaddress``)."""
    text = s.plain
    pos = 0
    while (hint := _V6_HINT.search(text, pos)) is not None:
        i = hint.start()
        while i > 0 and text[i - 1] in _HEX_COLON and hint.start() - i < 40:
            i -= 1
        tail = _V6_TAIL.match(text, hint.start())
        j = tail.end() if tail is not None else hint.end()
        pos = max(j, hint.end())
        if text[j - 1] == ":" and text[j - 2] != ":":
            j -= 1  # "host fe80::1: ..." - a trailing colon is punctuation
        if word_before(text, i, "_.") or (j < len(text) and (text[j].isalnum() or text[j] == "_")):
            continue
        candidate = text[i:j]
        if candidate.strip(":") == "":
            continue
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        out.append(("ip", i, j))
