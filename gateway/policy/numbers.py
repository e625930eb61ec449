"""Checksummed and structured numbers: payment cards (Luhn), US SSNs, IBANs (mod 97).

Digit groups may be joined by any one separator of ``SEPARATORS`` (space, ``.``, ``-``, ``/``,
``_``; Unicode dashes and dots arrive folded to these), used the same way between every group.
"""

from __future__ import annotations

import re

from gateway.policy.shape import (
    Shape,
    Span,
    context_before,
    finds,
    number_after,
    number_before,
    word_before,
)

_A = re.ASCII

# --- payment cards ------------------------------------------------------------------------------
# Digit groups joined by one separator, used the same way throughout.
_GROUPS = re.compile(r"[0-9]+(?:([ ./_-])[0-9]+(?:\1[0-9]+)*)?", _A)
_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # a digit doubled, minus 9 when over 9


def luhn_valid(number: str) -> bool:
    """The Luhn (mod 10) check that every payment card number passes (digits only)."""
    total = sum(map(int, number[-1::-2])) + sum(_DOUBLED[int(c)] for c in number[-2::-2])
    return total % 10 == 0


def _card_groups(groups: list[str]) -> bool:
    """How card numbers are written: 16 digits in one run, or 4-4-4-4, 4-6-5, 8-8, 4-4-4-1...:
    a first group of at least 4 digits, inner groups of 3 to 8 (``1 234 567`` is a number)."""
    if len(groups) == 1:
        return True
    return 4 <= len(groups[0]) <= 8 and all(3 <= len(g) <= 8 for g in groups[1:-1]) \
        and len(groups[-1]) <= 8


def _card_at(text: str, i: int, out: list[Span]) -> int:
    """A card starting at ``i``; returns where it ends (or ``i``)."""
    m = _GROUPS.match(text, i)
    if m is None:
        return i
    sep = m.group(1) or ""
    groups = m.group().split(sep) if sep else [m.group()]
    # The longest leading groups of at most 19 digits decide, in one Luhn check: "4111 1111 1111
    # 1111 2024" is a card and a year; "4111 1111 1111 1111 7" a 17-digit number.
    k = digits = 0
    while k < len(groups) and digits + len(groups[k]) <= 19:
        digits += len(groups[k])
        k += 1
    k = max(k, 1)
    number = "".join(groups[:k])
    if 13 <= len(number) <= 19 and number[0] != "0" and _card_groups(groups[:k]) \
            and luhn_valid(number) and not (len(number) == 13 and number[:3] in ("978", "979")) \
            and not context_before(text, i, ("isbn",), 8):
        end = i + len(number) + len(sep) * (k - 1)
        out.append(("card", i, end))
        return end
    return i


def cards(s: Shape, out: list[Span]) -> None:
    """Append payment card numbers: 13-19 digits that pass the Luhn check."""
    text, cls = s.plain, s.cls
    starts: list[int] = []
    previous = -1
    for hit in sorted({*finds(cls, "0000-000"), *finds(cls, "0" * 13)}):
        i = hit
        while i > previous and i > 0 and cls[i - 1] == "0":  # back to the group's start...
            i -= 1
        if i > previous:  # ...unless the digits run on to the previous hit (linear time)
            starts.append(i)
        previous = hit
    end = -1
    for i in starts:
        if i < end or word_before(text, i) or number_before(text, i):
            continue
        end = _card_at(text, i, out)


# --- US social security numbers -----------------------------------------------------------------
_SSN_CONTEXT = ("ssn", "social security", "ss#", "ss no", "ss-no", "ss number")


def _ssn_valid(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def ssns(s: Shape, out: list[Span]) -> None:
    """Append US SSNs: ``123-45-6789``, ``123 45 6789``, ``123.45.6789``; ``123456789`` only
    after a word that names it (``SSN``, ``social security``), as nine digits are too common."""
    text, cls = s.plain, s.cls
    for i in finds(cls, "000-00-0000"):
        j = i + 11
        sep = text[i + 3]
        if sep not in " .-" or text[i + 6] != sep or word_before(text, i):
            continue
        if (i > 1 and text[i - 1] == sep and text[i - 2].isdigit()) or number_after(text, j):
            continue
        if _ssn_valid(text[i:i + 3], text[i + 4:i + 6], text[i + 7:j]):
            out.append(("us_ssn", i, j))
    for i in finds(cls, "0" * 9):
        j = i + 9
        if (i > 0 and cls[i - 1] == "0") or (j < len(cls) and cls[j] == "0"):
            continue  # part of a longer run
        if word_before(text, i) or number_before(text, i) or number_after(text, j):
            continue
        if _ssn_valid(text[i:i + 3], text[i + 3:i + 5], text[i + 5:j]) \
                and context_before(text, i, _SSN_CONTEXT):
            out.append(("us_ssn", i, j))


# --- IBAN ---------------------------------------------------------------------------------------
_IBAN = re.compile(r"[A-Za-z]{2}[0-9]{2}(?:[ -]?[A-Za-z0-9]{4}){2,7}(?:[ -]?[A-Za-z0-9]{1,3})?"
                   r"(?![A-Za-z0-9])", _A)
_IBAN_LETTERS = str.maketrans({chr(65 + i): str(10 + i) for i in range(26)})  # A=10 ... Z=35


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check: length 15-34 and the mod-97 checksum equals 1 (spaces, dashes ignored)."""
    s = candidate.replace(" ", "").replace("-", "").upper()
    if not 15 <= len(s) <= 34 or not s.isascii() or not s.isalnum():
        return False
    return int((s[4:] + s[:4]).translate(_IBAN_LETTERS)) % 97 == 1


def ibans(s: Shape, out: list[Span]) -> None:
    """Append IBANs, grouped by spaces or dashes or not at all, checked by mod 97."""
    cls = s.cls
    for i in finds(cls, "aa00"):
        if i > 0 and cls[i - 1] in "a0":
            continue
        m = _IBAN.match(s.plain, i)
        if m is not None and iban_valid(m.group()):
            out.append(("iban", i, m.end()))
