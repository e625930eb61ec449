"""The individual PII detectors behind ``pii.scan``: candidate search, regex, validator.

``detect`` runs the wanted detectors over a ``Shape`` and returns ``(detector, start, end)``
spans. Candidates are located with ``bytes.find`` or simple byte regexes on the shape (C speed,
no per-character work in Python), then confirmed with an anchored regex at that position and a
validator. See ``pii`` for the contract.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from collections.abc import Collection, Iterator

_A = re.ASCII
Span = tuple[str, int, int]
# Digits become "0"; ASCII whitespace other than the space becomes "\t" (normalization checks it).
_DIGIT_MAP = bytes.maketrans(b"0123456789\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f", b"0" * 10 + b"\t" * 9)
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ALNUM_MAP = bytes.maketrans(_LETTERS + b"0123456789", b"A" * 52 + b"0" * 10)
# Characters of API keys, tokens, JWTs and base64: runs of them are where secrets can hide.
_TOKEN_CHARS = set(_LETTERS + b"0123456789+/=_.~-")
_TOKEN_MAP = bytes(0x61 if i in _TOKEN_CHARS else 0x20 for i in range(256))


class Shape:
    """One text prepared for the detectors, as ASCII strings of the same length (non-ASCII
    characters become ``?``, so offsets carry over): ``digits`` has every digit as ``0``.

    The maps are built with ``bytes.translate`` (fastest) but kept as ``str``: ``bytes.find``
    and ``in`` first try their argument as an integer and pay for a formatted ``TypeError``.
    """

    __slots__ = ("_alnum", "_tokens", "digits", "raw", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.raw = text.encode("ascii", "replace")
        self.digits = self.raw.translate(_DIGIT_MAP).decode("ascii")
        self._alnum: str | None = None
        self._tokens: str | None = None

    @property
    def alnum(self) -> str:
        """Letters as ``A``, digits as ``0``."""
        if self._alnum is None:
            self._alnum = self.raw.translate(_ALNUM_MAP).decode("ascii")
        return self._alnum

    @property
    def tokens(self) -> str:
        """Token characters as ``a``, everything else as a space."""
        if self._tokens is None:
            self._tokens = self.raw.translate(_TOKEN_MAP).decode("ascii")
        return self._tokens


def _finds(hay: str, needle: str) -> Iterator[int]:
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


def _emails(s: Shape, out: list[Span]) -> None:
    text = s.text
    for at in _finds(s.text, "@"):
        dm = _DOMAIN.match(text, at)
        if dm is not None:
            lm = _LOCAL.search(text, max(0, at - 64), at)
            if lm is not None:
                out.append(("email", lm.start(), dm.end()))


# --- numbers: phones, cards, SSNs, IPv4 -----------------------------------------------------------
# A run of digits and separators long enough to hold any of them; everything else is skipped.
_CLUSTER = re.compile(r"0[0 ()./-]{6,}")
_INTL = re.compile(r"\+[1-9][0-9]{0,2}(?:[ .-]?\([0-9]{1,4}\))?(?:[ .-]?[0-9]{1,5}){2,6}", _A)
_PAREN = re.compile(r"\([0-9]{2,5}\)[ .-]?[0-9]{3,4}[ .-]?[0-9]{3,5}", _A)
_US = re.compile(r"[0-9]{3}([.-])[0-9]{3}\1[0-9]{4}", _A)
_NATIONAL = re.compile(r"0[0-9]{1,4}[ /-][0-9]{2,8}(?:[ -][0-9]{2,8}){0,3}", _A)
# First character of a candidate -> (form, min digits, max digits).
_PHONE_FORMS = {"+": (_INTL, 8, 15), "(": (_PAREN, 9, 12), "0": (_NATIONAL, 9, 12)}
_CARD_NEEDLES = ("0" * 13, "0000 0000 0000 0", "0000-0000-0000-0",
                 "0000 000000 0000", "0000-000000-0000")
_CARD = re.compile(r"[0-9]{4}(?:([ -]?)[0-9]{4}\1[0-9]{4}\1[0-9]{1,4}(?:\1[0-9]{1,3})?"
                   r"|([ -]?)[0-9]{6}\2[0-9]{4,5})(?![0-9])", _A)
_V4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}", _A)


def luhn_valid(number: str) -> bool:
    """The Luhn (mod 10) check that every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(number)):
        v = ord(ch) - 48
        if i & 1:
            v = v * 2 - 9 if v > 4 else v * 2
        total += v
    return total % 10 == 0


def _phone_at(text: str, i: int, regex: re.Pattern[str], lo: int, hi: int, out: list[Span]) -> None:
    if _word_before(text, i, "#$+.,/-_"):
        return
    m = regex.match(text, i)
    if m is not None and not _number_after(text, m.end()) and lo <= _digit_count(m.group()) <= hi:
        out.append(("phone", i, m.end()))


def _phones(text: str, chunk: bytes, a: int, out: list[Span]) -> None:
    # Forms that open with "+", "(" or a trunk "0" start where the cluster starts (neither "+"
    # nor a leading "(" belongs to the cluster); the US dashed form can sit anywhere in it.
    lead = text[a - 1] if a > 0 and text[a - 1] in "+(" else text[a]
    form = _PHONE_FORMS.get(lead)
    if form is not None:
        _phone_at(text, a - (lead != text[a]), *form, out)
    for needle in ("000-000-0000", "000.000.0000"):
        if needle in chunk:
            for off in _finds(chunk, needle):
                _phone_at(text, a + off, _US, 10, 10, out)
    if "(00" in chunk:
        for off in _finds(chunk, "(00"):
            if off:
                _phone_at(text, a + off, _PAREN, 9, 12, out)


def _cards(text: str, digits: bytes, chunk: bytes, a: int, out: list[Span]) -> None:
    starts = sorted({a + off for needle in _CARD_NEEDLES for off in _finds(chunk, needle)})
    end = -1
    for i in starts:
        if i < end or (i > 0 and digits[i - 1] == "0"):
            continue
        m = _CARD.match(text, i)
        if m is not None:
            number = m.group().replace(" ", "").replace("-", "")
            if number[0] != "0" and luhn_valid(number):
                end = m.end()
                out.append(("card", i, end))


def _ssns(text: str, chunk: bytes, a: int, out: list[Span]) -> None:
    for off in _finds(chunk, "000-00-0000"):
        i = a + off
        j = i + 11
        if _word_before(text, i) or (i > 1 and text[i - 1] == "-" and text[i - 2].isdigit()):
            continue
        if _number_after(text, j):
            continue
        area, group, serial = text[i:i + 3], text[i + 4:i + 6], text[i + 7:j]
        if area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000":
            out.append(("us_ssn", i, j))


def _ipv4s(text: str, chunk: bytes, a: int, out: list[Span]) -> None:
    pos = 0
    while (m := _V4.search(text, a + pos, a + len(chunk))) is not None:
        pos = m.end() - a
        i = m.start()
        if _word_before(text, i, ".") or _number_after(text, m.end()):
            continue
        try:
            ipaddress.IPv4Address(m.group())
        except ValueError:
            continue
        out.append(("ip", i, m.end()))


def _numbers(s: Shape, want: Collection[str], out: list[Span]) -> None:
    """Phones, cards, SSNs and IPv4 addresses, found inside the text's long numeric clusters."""
    text, digits = s.text, s.digits
    cards, ssns, phones, ips = ("card" in want, "us_ssn" in want, "phone" in want, "ip" in want)
    for m in _CLUSTER.finditer(digits):
        chunk = m.group()
        n = chunk.count("0")
        a = m.start()
        if n >= 8:  # dates and prices stop here: every phone, card and SSN has 8+ digits
            if n >= 13 and cards:
                _cards(text, digits, chunk, a, out)
            if n >= 9 and ssns and "000-00-0000" in chunk:
                _ssns(text, chunk, a, out)
            if phones and (text[a - 1:a] in ("+", "(") or text[a] == "0" or "(00" in chunk
                           or "000-000-0000" in chunk or "000.000.0000" in chunk):
                _phones(text, chunk, a, out)
        if ips and n >= 4 and chunk.count(".") >= 3:
            _ipv4s(text, chunk, a, out)


# --- IBAN ---------------------------------------------------------------------------------------
_IBAN = re.compile(r"[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]{4}){2,7}(?: ?[A-Za-z0-9]{1,3})?"
                   r"(?![A-Za-z0-9])", _A)


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check: length 15-34 and the mod-97 checksum equals 1."""
    s = candidate.replace(" ", "").upper()
    if not 15 <= len(s) <= 34 or not s.isalnum():
        return False
    return int("".join(str(int(c, 36)) for c in s[4:] + s[:4])) % 97 == 1


def _ibans(s: Shape, out: list[Span]) -> None:
    shape = s.alnum
    for i in _finds(shape, "AA00"):
        if i > 0 and shape[i - 1] in "A0":
            continue
        m = _IBAN.match(s.text, i)
        if m is not None and iban_valid(m.group()):
            out.append(("iban", i, m.end()))


# --- IP addresses -------------------------------------------------------------------------------
_V6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_V6_TAIL = re.compile(r"(?:[0-9A-Fa-f]{0,4}:)*(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9])"
                      r"|[0-9A-Fa-f]{0,4})", _A)
_HEX_COLON = frozenset("0123456789abcdefABCDEF:")


def _ipv6s(s: Shape, out: list[Span]) -> None:
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
        out.append(("ip", i, j))


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
_LONG_RUN = "a" * 20


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _random_looking(s: str, hex_only: bool) -> bool:
    digits = _digit_count(s)
    letters = sum(c.isalpha() for c in s)
    if hex_only:
        return digits >= 1 and letters >= 1 and _entropy(s) >= 3.0
    return digits >= 2 and letters >= 2 and _entropy(s) >= 4.0


def _in_run(text: str, i: int, j: int, out: list[Span]) -> None:
    """Secrets inside one run of token characters ``text[i:j]``."""
    for m in _PREFIXED.finditer(text, i, j):
        body = m.group()[4:]
        if not _word_before(text, m.start()) and (m.group()[:4].isupper() or _digit_count(body)):
            out.append(("secret", m.start(), m.end()))
    if _BEARER.search(text, max(0, i - 16), i) is not None:
        out.append(("secret", i, j))
    if j - i >= 32:
        for m in _HEX_RUN.finditer(text, i, j):
            if not _word_before(text, m.start()) and _random_looking(m.group(), True):
                out.append(("secret", m.start(), m.end()))
        for m in _PIECES.finditer(text, i, j):
            if _random_looking(m.group(), False):
                out.append(("secret", m.start(), m.end()))


def _secrets(s: Shape, out: list[Span]) -> None:
    tokens = s.tokens
    i = tokens.find(_LONG_RUN)
    while i >= 0:
        j = tokens.find(" ", i)
        j = len(tokens) if j < 0 else j
        _in_run(s.text, i, j, out)
        i = tokens.find(_LONG_RUN, j)


_NUMERIC = frozenset({"phone", "card", "us_ssn", "ip"})


def detect(s: Shape, want: Collection[str]) -> list[Span]:
    """Every span the wanted detectors find, unordered; cheap necessary conditions first."""
    out: list[Span] = []
    text, digits = s.text, s.digits
    if "email" in want and "@" in text:
        _emails(s, out)
    if "0" in digits:
        if not _NUMERIC.isdisjoint(want):
            _numbers(s, want, out)
        if "iban" in want and ("00000000" in digits or "0000 0000" in digits):
            _ibans(s, out)
    if "ip" in want and ":" in text:
        _ipv6s(s, out)
    if "secret" in want and _LONG_RUN in s.tokens:
        _secrets(s, out)
    return out
