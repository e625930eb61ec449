"""The individual PII detectors behind ``pii.scan``: candidate search, regex, validator.

``detect`` runs the wanted detectors over a ``Shape`` and returns ``(detector, start, end)``
spans. On the hot path (text with no PII) a detector costs a few ``str.find`` calls on the shape,
each a C-speed scan: a regex scan over the text costs ten times more. Only where a needle hits
does an anchored regex run, followed by a validator (Luhn, mod-97, ``ipaddress``). Secrets live
in ``tokens``. Only ASCII digits count: a policy that wants full-width digits folded uses NFKC.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterator

from gateway.policy.tokens import LONG_RUN, TOKEN_MAP, find_secrets

_A = re.ASCII
Span = tuple[str, int, int]
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# One translation serves every detector: digits become "0", ASCII letters "a", ASCII whitespace
# other than the space "\t" (normalization checks for it); everything else stays as it is.
_CLASS_MAP = bytes.maketrans(
    b"0123456789" + _LETTERS + b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f",
    b"0" * 10 + b"a" * 52 + b"\t" * 9,
)


class Shape:
    """One text prepared for the detectors: ``cls`` is an ASCII string of the same length with
    every digit as ``0`` and every ASCII letter as ``a`` (non-ASCII characters become ``?``, so
    offsets carry over). ``000-00-0000`` in ``cls`` is where an SSN can be.

    Maps are built with ``bytes.translate`` (fastest) but kept as ``str``: ``bytes.find`` and
    ``in`` first try their argument as an integer and pay for a formatted ``TypeError``.
    """

    __slots__ = ("_tokens", "cls", "raw", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.raw = text.encode("ascii", "replace")
        self.cls = self.raw.translate(_CLASS_MAP).decode("ascii")
        self._tokens: str | None = None

    @property
    def tokens(self) -> str:
        """Token characters as ``a``, everything else as a space."""
        if self._tokens is None:
            self._tokens = self.raw.translate(TOKEN_MAP).decode("ascii")
        return self._tokens


def _finds(hay: str, needle: str) -> Iterator[int]:
    i = hay.find(needle)
    while i >= 0:
        yield i
        i = hay.find(needle, i + 1)


def _digit_count(s: str) -> int:
    return sum(map(str.isdigit, s))


def _word_before(text: str, i: int, also: str = "") -> bool:
    """Whether ``text[i-1]`` continues a word/number (so a match at ``i`` starts mid-token)."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in also)


def _number_before(text: str, i: int) -> bool:
    """Whether ``i`` starts a later group of a longer number (``1234 5678``: the ``5678``)."""
    return i > 1 and text[i - 1] in " -" and text[i - 2].isdigit()


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
    for at in _finds(text, "@"):
        dm = _DOMAIN.match(text, at)
        if dm is not None:
            lm = _LOCAL.search(text, max(0, at - 64), at)
            if lm is not None:
                out.append(("email", lm.start(), dm.end()))


# --- phone numbers ------------------------------------------------------------------------------
_INTL = re.compile(r"\+[1-9][0-9]{0,2}(?:[ .-]?\([0-9]{1,4}\))?(?:[ .-]?[0-9]{1,5}){2,6}", _A)
_PAREN = re.compile(r"\([0-9]{2,5}\)[ .-]?[0-9]{3,4}[ .-]?[0-9]{3,5}", _A)
_US = re.compile(r"[0-9]{3}([.-])[0-9]{3}\1[0-9]{4}", _A)
_NATIONAL = re.compile(r"0[0-9]{1,4}[ /-][0-9]{2,8}(?:[ -][0-9]{2,8}){0,3}", _A)


def _phone_at(text: str, i: int, regex: re.Pattern[str], lo: int, hi: int, out: list[Span]) -> None:
    if _word_before(text, i, "#$+.,/-_"):
        return
    if _number_before(text, i):
        return
    m = regex.match(text, i)
    if m is not None and not _number_after(text, m.end()) and lo <= _digit_count(m.group()) <= hi:
        out.append(("phone", i, m.end()))


def _phones(s: Shape, out: list[Span]) -> None:
    text, cls = s.text, s.cls
    if "+" in text:  # +44 20 7946 0958, +1 (555) 123-4567
        for i in _finds(cls, "+0"):
            _phone_at(text, i, _INTL, 8, 15, out)
    if "(" in text:  # (555) 123-4567
        for i in _finds(cls, "(00"):
            _phone_at(text, i, _PAREN, 9, 12, out)
    for needle in ("000-000-0000", "000.000.0000"):  # 555-123-4567
        if needle in cls:
            for i in _finds(cls, needle):
                _phone_at(text, i, _US, 10, 10, out)
    # National numbers open with a trunk 0: 020 7946 0958, 030 1234567.
    if text[:1] == "0":
        _phone_at(text, 0, _NATIONAL, 9, 12, out)
    for needle in (" 0", ":0"):
        if needle[0] in text and needle in text:
            for i in _finds(text, needle):
                _phone_at(text, i + 1, _NATIONAL, 9, 12, out)


# --- payment cards ------------------------------------------------------------------------------
_CARD_NEEDLES = ("0" * 13, "0000 0000 0000 0", "0000-0000-0000-0", "0000 000000 0000",
                 "0000-000000-0000")
_CARD = re.compile(r"[0-9]{4}(?:([ -]?)[0-9]{4}\1[0-9]{4}\1[0-9]{1,4}(?:\1[0-9]{1,3})?"
                   r"|([ -]?)[0-9]{6}\2[0-9]{4,5})(?![0-9])", _A)


_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # a digit doubled, minus 9 when over 9


def luhn_valid(number: str) -> bool:
    """The Luhn (mod 10) check that every payment card number passes (digits only)."""
    total = sum(map(int, number[-1::-2])) + sum(_DOUBLED[int(c)] for c in number[-2::-2])
    return total % 10 == 0


def _cards(s: Shape, out: list[Span]) -> None:
    text, cls = s.text, s.cls
    end = -1
    for i in sorted({i for needle in _CARD_NEEDLES for i in _finds(cls, needle)}):
        if i < end or (i > 0 and cls[i - 1] == "0") or _number_before(text, i):
            continue
        m = _CARD.match(text, i)
        if m is not None:
            number = m.group().replace(" ", "").replace("-", "")
            if number[0] != "0" and luhn_valid(number):
                end = m.end()
                out.append(("card", i, end))


# --- US social security numbers -----------------------------------------------------------------
def _ssns(s: Shape, out: list[Span]) -> None:
    text = s.text
    for i in _finds(s.cls, "000-00-0000"):
        j = i + 11
        if _word_before(text, i) or (i > 1 and text[i - 1] == "-" and text[i - 2].isdigit()):
            continue
        if _number_after(text, j):
            continue
        area, group, serial = text[i:i + 3], text[i + 4:i + 6], text[i + 7:j]
        if area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000":
            out.append(("us_ssn", i, j))


# --- IBAN ---------------------------------------------------------------------------------------
_IBAN = re.compile(r"[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]{4}){2,7}(?: ?[A-Za-z0-9]{1,3})?"
                   r"(?![A-Za-z0-9])", _A)


_IBAN_LETTERS = str.maketrans({chr(65 + i): str(10 + i) for i in range(26)})  # A=10 ... Z=35


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check: length 15-34 and the mod-97 checksum equals 1."""
    s = candidate.replace(" ", "").upper()
    if not 15 <= len(s) <= 34 or not s.isascii() or not s.isalnum():
        return False
    return int((s[4:] + s[:4]).translate(_IBAN_LETTERS)) % 97 == 1


def _ibans(s: Shape, out: list[Span]) -> None:
    cls = s.cls
    for i in _finds(cls, "aa00"):
        if i > 0 and cls[i - 1] in "a0":
            continue
        m = _IBAN.match(s.text, i)
        if m is not None and iban_valid(m.group()):
            out.append(("iban", i, m.end()))


# --- IP addresses -------------------------------------------------------------------------------
_V4_HINT = re.compile(r"\.0{1,3}\.0{1,3}\.0")
_V4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}", _A)
_V6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_V6_TAIL = re.compile(r"(?:[0-9A-Fa-f]{0,4}:)*(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?![0-9])"
                      r"|[0-9A-Fa-f]{0,4})", _A)
_HEX_COLON = frozenset("0123456789abcdefABCDEF:")


def _ipv4s(s: Shape, out: list[Span]) -> None:
    text, cls = s.text, s.cls
    for hint in _V4_HINT.finditer(cls):
        i = hint.start()
        while i > 0 and cls[i - 1] == "0" and hint.start() - i < 3:
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
        out.append(("ip", i, m.end()))


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


def detect(s: Shape, want: Collection[str]) -> list[Span]:
    """Every span the wanted detectors find, unordered; cheap necessary conditions first."""
    out: list[Span] = []
    text, cls = s.text, s.cls
    if "email" in want and "@" in text:
        _emails(s, out)
    digits = cls.count("0") if "0" in cls else 0
    if digits >= 8:  # every phone, card, SSN and IBAN has at least 8 digits
        if "card" in want and ("0000 0000" in cls or "0000-0000" in cls or "0" * 13 in cls):
            _cards(s, out)
        if "us_ssn" in want and "000-00-0000" in cls:
            _ssns(s, out)
        if "phone" in want:
            _phones(s, out)
        if "iban" in want and ("0000 0000" in cls or "00000000" in cls) and "aa00" in cls:
            _ibans(s, out)
    if digits >= 4 and "ip" in want and "0.0" in cls:
        _ipv4s(s, out)
    if "ip" in want and ":" in text:
        _ipv6s(s, out)
    if "secret" in want and LONG_RUN in s.tokens:
        find_secrets(s.text, s.tokens, out)
    return out
