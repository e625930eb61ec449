"""The individual PII detectors behind ``pii.scan``: candidate search, regex, validator.

Each detector takes a ``Shape`` and yields ``(start, end)`` spans. Candidates are located with
``bytes.find`` on the shape (C speed, no per-character regex attempts), then confirmed with an
anchored regex at that position and a validator. See ``pii`` for the contract.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from collections.abc import Iterator

_A = re.ASCII
_DIGIT_MAP = bytes.maketrans(b"0123456789", b"0" * 10)
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ALNUM_MAP = bytes.maketrans(_LETTERS + b"0123456789", b"A" * 52 + b"0" * 10)
# Characters of API keys, tokens, JWTs and base64: runs of them are where secrets can hide.
_TOKEN_CHARS = set(_LETTERS + b"0123456789+/=_.~-")
_TOKEN_MAP = bytes(0x61 if i in _TOKEN_CHARS else 0x20 for i in range(256))


class Shape:
    """One text prepared for the detectors: one byte per character (non-ASCII becomes ``?``,
    so byte offsets are character offsets), digits mapped to ``0``; other maps on demand."""

    __slots__ = ("_alnum", "_tokens", "digits", "raw", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.raw = text.encode("ascii", "replace")
        self.digits = self.raw.translate(_DIGIT_MAP)
        self._alnum: bytes | None = None
        self._tokens: bytes | None = None

    @property
    def alnum(self) -> bytes:
        """Letters as ``A``, digits as ``0``."""
        if self._alnum is None:
            self._alnum = self.raw.translate(_ALNUM_MAP)
        return self._alnum

    @property
    def tokens(self) -> bytes:
        """Token characters as ``a``, everything else as a space."""
        if self._tokens is None:
            self._tokens = self.raw.translate(_TOKEN_MAP)
        return self._tokens


def _finds(hay: bytes, needle: bytes) -> Iterator[int]:
    i = hay.find(needle)
    while i >= 0:
        yield i
        i = hay.find(needle, i + 1)


def _digit_count(s: str) -> int:
    return sum(c.isdigit() for c in s)


def _word_before(text: str, i: int, also: str = "") -> bool:
    """Whether ``text[i-1]`` continues a word/number (so a match at ``i`` starts mid-token)."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in also)


def _number_after(text: str, j: int) -> bool:
    """Whether a number continues at ``j`` (``5``, ``.5``, ``-5``...): the match was cut short."""
    if j >= len(text):
        return False
    c = text[j]
    return c.isalnum() or (c in ".,-/" and j + 1 < len(text) and text[j + 1].isdigit())


# --- e-mail ------------------------------------------------------------------------------------
_DOMAIN = re.compile(r"@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+[^\W\d_]{2,24}(?![\w-])")
_LOCAL = re.compile(r"[\w%+'-][\w.%+'-]{0,63}\Z")


def email(s: Shape) -> Iterator[tuple[int, int]]:
    text = s.text
    for at in _finds(s.raw, b"@"):
        dm = _DOMAIN.match(text, at)
        if dm is not None:
            lm = _LOCAL.search(text, max(0, at - 64), at)
            if lm is not None:
                yield lm.start(), dm.end()


# --- phone numbers ------------------------------------------------------------------------------
# (regex, needles on the digit shape, min digits, max digits, starts with a national trunk "0")
_PHONE_FORMS = (
    (re.compile(r"\+[1-9][0-9]{0,2}(?:[ .-]?\([0-9]{1,4}\))?(?:[ .-]?[0-9]{1,5}){2,6}", _A),
     (b"+0",), 8, 15, False),                                       # +44 20 7946 0958
    (re.compile(r"\([0-9]{2,5}\)[ .-]?[0-9]{3,4}[ .-]?[0-9]{3,5}", _A),
     (b"(00",), 9, 12, False),                                      # (555) 123-4567
    (re.compile(r"[0-9]{3}([.-])[0-9]{3}\1[0-9]{4}", _A),
     (b"000-000-0000", b"000.000.0000"), 10, 10, False),            # 555-123-4567
    (re.compile(r"0[0-9]{1,4}[ /-][0-9]{2,8}(?:[ -][0-9]{2,8}){0,3}", _A),
     (b"00 00", b"00-00", b"00/00"), 9, 12, True),                  # 020 7946 0958, 030 1234567
)


def phone(s: Shape) -> Iterator[tuple[int, int]]:
    text, digits = s.text, s.digits
    for regex, needles, lo, hi, trunk in _PHONE_FORMS:
        for needle in needles:
            for i in _finds(digits, needle):
                if trunk:  # the needle can hit mid-number: go back to where the digits start
                    while i > 0 and digits[i - 1] == 0x30:
                        i -= 1
                    if text[i] != "0":
                        continue
                if _word_before(text, i, "#$+.,/-_"):
                    continue
                m = regex.match(text, i)
                if m is not None and not _number_after(text, m.end()):
                    if lo <= _digit_count(m.group()) <= hi:
                        yield i, m.end()


# --- payment cards ------------------------------------------------------------------------------
_CARD_NEEDLES = (b"0" * 13, b"0000 0000 0000 0", b"0000-0000-0000-0",
                 b"0000 000000 0000", b"0000-000000-0000")
_CARD = re.compile(r"[0-9]{4}(?:([ -]?)[0-9]{4}\1[0-9]{4}\1[0-9]{1,4}(?:\1[0-9]{1,3})?"
                   r"|([ -]?)[0-9]{6}\2[0-9]{4,5})(?![0-9])", _A)


def luhn_valid(number: str) -> bool:
    """The Luhn (mod 10) check that every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(number)):
        v = ord(ch) - 48
        if i & 1:
            v = v * 2 - 9 if v > 4 else v * 2
        total += v
    return total % 10 == 0


def card(s: Shape) -> Iterator[tuple[int, int]]:
    text, digits = s.text, s.digits
    starts = sorted({i for needle in _CARD_NEEDLES for i in _finds(digits, needle)})
    end = -1
    for i in starts:
        if i < end or (i > 0 and digits[i - 1] == 0x30):
            continue
        m = _CARD.match(text, i)
        if m is not None:
            number = m.group().replace(" ", "").replace("-", "")
            if number[0] != "0" and luhn_valid(number):
                end = m.end()
                yield i, end


# --- US social security numbers -----------------------------------------------------------------
def us_ssn(s: Shape) -> Iterator[tuple[int, int]]:
    text, digits = s.text, s.digits
    for i in _finds(digits, b"000-00-0000"):
        j = i + 11
        if _word_before(text, i) or (i > 1 and text[i - 1] == "-" and text[i - 2].isdigit()):
            continue
        if _number_after(text, j):
            continue
        area, group, serial = text[i:i + 3], text[i + 4:i + 6], text[i + 7:j]
        if area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000":
            yield i, j


# --- IBAN ---------------------------------------------------------------------------------------
_IBAN = re.compile(r"[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]{4}){2,7}(?: ?[A-Za-z0-9]{1,3})?"
                   r"(?![A-Za-z0-9])", _A)


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check: length 15-34 and the mod-97 checksum equals 1."""
    s = candidate.replace(" ", "").upper()
    if not 15 <= len(s) <= 34 or not s.isalnum():
        return False
    return int("".join(str(int(c, 36)) for c in s[4:] + s[:4])) % 97 == 1


def iban(s: Shape) -> Iterator[tuple[int, int]]:
    if b"00000000" not in s.digits and b"0000 0000" not in s.digits:
        return
    shape = s.alnum
    for i in _finds(shape, b"AA00"):
        if i > 0 and shape[i - 1] in (0x41, 0x30):
            continue
        m = _IBAN.match(s.text, i)
        if m is not None and iban_valid(m.group()):
            yield i, m.end()


# --- IP addresses -------------------------------------------------------------------------------
_V4_HINT = re.compile(rb"\.0{1,3}\.0{1,3}\.0")
_V4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}", _A)
_V6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_V6_TAIL = re.compile(r"(?:[0-9A-Fa-f]{0,4}:)*(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9])"
                      r"|[0-9A-Fa-f]{0,4})", _A)
_HEX_COLON = frozenset("0123456789abcdefABCDEF:")


def _ipv4(s: Shape) -> Iterator[tuple[int, int]]:
    text, digits = s.text, s.digits
    for hint in _V4_HINT.finditer(digits):
        i = hint.start()
        while i > 0 and digits[i - 1] == 0x30 and hint.start() - i < 3:
            i -= 1
        if i == hint.start() or _word_before(text, i, "."):
            continue
        m = _V4.match(text, i)
        if m is None or _number_after(text, m.end()):
            continue
        try:
            ipaddress.IPv4Address(m.group())
        except ValueError:
            continue
        yield i, m.end()


def _ipv6(s: Shape) -> Iterator[tuple[int, int]]:
    text = s.text
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
        if _word_before(text, i, "_.") or (j < len(text) and (text[j].isalnum() or text[j] == "_")):
            continue
        candidate = text[i:j]
        if candidate.strip(":") == "":
            continue
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        yield i, j


def ip(s: Shape) -> Iterator[tuple[int, int]]:
    if b"0" in s.digits:
        yield from _ipv4(s)
    if ":" in s.text:
        yield from _ipv6(s)


# --- secrets ------------------------------------------------------------------------------------
# Known token formats. Case variants cover text that the policy case-folded.
_PREFIXED = re.compile(
    r"sk-[A-Za-z0-9_-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|github_pat_[A-Za-z0-9_]{22,}|(?:AKIA|ASIA)[0-9A-Z]{16}|(?:akia|asia)[0-9a-z]{16}"
    r"|xox[baprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{20,}|(?:AIza|aiza)[0-9A-Za-z_-]{35}"
    r"|ey[Jj][A-Za-z0-9_-]{8,}\.ey[Jj][A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", _A)
_BEARER = re.compile(r"(?i:bearer)\s+\Z")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{32,}", _A)
_PIECES = re.compile(r"[A-Za-z0-9+/_-]{32,}", _A)
_LONG_RUN = b"a" * 20


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _random_looking(s: str, hex_only: bool) -> bool:
    digits = _digit_count(s)
    letters = sum(c.isalpha() for c in s)
    if hex_only:
        return digits >= 1 and letters >= 1 and _entropy(s) >= 3.0
    return digits >= 2 and letters >= 2 and _entropy(s) >= 4.0


def _in_run(text: str, i: int, j: int) -> Iterator[tuple[int, int]]:
    """Secrets inside one run of token characters ``text[i:j]``."""
    for m in _PREFIXED.finditer(text, i, j):
        body = m.group()[4:]
        if not _word_before(text, m.start()) and (m.group()[:4].isupper() or _digit_count(body)):
            yield m.span()
    if _BEARER.search(text, max(0, i - 16), i) is not None:
        yield i, j
    if j - i >= 32:
        for m in _HEX_RUN.finditer(text, i, j):
            if not _word_before(text, m.start()) and _random_looking(m.group(), True):
                yield m.span()
        for m in _PIECES.finditer(text, i, j):
            if _random_looking(m.group(), False):
                yield m.span()


def secret(s: Shape) -> Iterator[tuple[int, int]]:
    tokens = s.tokens
    if _LONG_RUN not in tokens:
        return
    i = tokens.find(_LONG_RUN)
    while i >= 0:
        j = tokens.find(b" ", i)
        j = len(tokens) if j < 0 else j
        yield from _in_run(s.text, i, j)
        i = tokens.find(_LONG_RUN, j)
