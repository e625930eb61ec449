"""Contact details: e-mail addresses (also written ``[at]``, `` at ``, `` dot ``), phone numbers.

E-mail: a ``@`` (a full-width one arrives folded) with a local part and a domain, one space
allowed on either side. Spelled-out at-signs are where false positives hide ("look at
example.com", "the dot com boom"), so each form asks for something prose does not write:
a bracketed ``[at]``/``(at)`` always counts; a plain `` at `` only after a local part that a word
is not (a digit, ``.``, ``_`` or ``+`` in it, and two letters: ``john.doe at example.com``, not
``v2.1 at python.org``), or in capitals with `` DOT `` (``john AT example DOT com``).

Phones: ``+CC ...`` and ``00CC ...`` international forms, ``(555) 123-4567``, US ``555-123-4567``
(also with dots, spaces or a leading ``1``), national forms with a trunk ``0`` (``020 7946
0958``), and bare digit runs where the digits alone say phone: a valid North American number
(``5551234567``, ``15551234567``) or 10-12 digits after a trunk ``0``.
"""

from __future__ import annotations

import re

from gateway.policy.shape import (
    Shape,
    Span,
    context_before,
    digit_count,
    finds,
    number_after,
    number_before,
    word_before,
)

_A = re.ASCII

# --- e-mail ------------------------------------------------------------------------------------
_LABEL = r"[^\W_](?:[\w-]{0,61}[^\W_])?"
_TLD = r"[^\W\d_]{2,24}(?![\w-])"
_DOMAIN = re.compile(rf"@ ?(?:{_LABEL}\.)+{_TLD}")
# A space before the at-sign only after a local part that starts like a name ("curl -d @x.json").
_LOCAL = re.compile(r"(?:[\w%+'-][\w.%+'-]{0,63}|(?<![\w.%+'-])[^\W_][\w.%+'-]{0,63} )\Z")
# Spelled-out forms. An obfuscated dot: " dot ", "[dot]", "(dot)"...; "." too.
_OBF_DOT = r"(?: ?[\[({<] ?(?i:dot) ?[\])}>] ?| (?i:dot) )"
_OBF_DOMAIN = re.compile(rf"(?:{_LABEL}(?:\.|{_OBF_DOT}))+{_TLD}")
# The local part is matched backwards from the at-sign (on the reversed text: linear time).
_OBF_LOCAL_REVERSED = re.compile(r"[\w.%+'-]+(?:(?: ?[\])}>] ?(?i:tod) ?[\[({<] ?| (?i:tod) )"
                                 r"[\w.%+'-]+)*")
# "[at]", "(@)"... as they look in the class map (letters are "a"), by opening bracket.
_BRACKETED = (("(", ("(aa)", "(@)")), ("[", ("[aa]", "[@]")), ("{", ("{aa}",)), ("<", ("<aa>",)))
_BRACKET_AT = re.compile(r" ?[\[({<] ?(?:(?i:at)|@) ?[\])}>] ?")
_PLAIN_LOCAL = re.compile(r"[._+0-9]| (?i:dot) |[\[({<]")
_NAME = re.compile(r"[^\W\d_]{2}")  # "v2.1 at python.org" is a version, not a mailbox


def _obfuscated_at(text: str, at: int, end: int, plain: bool, out: list[Span]) -> None:
    """An address whose at-sign is ``text[at:end]`` (spaces included)."""
    dm = _OBF_DOMAIN.match(text, end)
    if dm is None:
        return
    lm = _OBF_LOCAL_REVERSED.match(text[max(0, at - 96):at][::-1])
    if lm is None:
        return
    start = at - lm.end()
    if plain:
        local, domain = text[start:at], dm.group()
        capitals = text[at + 1:end - 1] == "AT" and " DOT " in domain and not local.isupper()
        if not capitals and (_PLAIN_LOCAL.search(local) is None or _NAME.search(local) is None):
            return
    out.append(("email", start, dm.end()))


def emails(s: Shape, out: list[Span]) -> None:
    """Append e-mail addresses, plain and obfuscated."""
    text, plain = s.text, s.plain
    if "@" in plain:  # the common case, text without one, makes no generator
        for at in finds(plain, "@"):
            dm = _DOMAIN.match(text, at)
            if dm is not None:
                lm = _LOCAL.search(text, max(0, at - 65), at)
                if lm is not None:
                    out.append(("email", lm.start(), dm.end()))
    cls = s.cls
    for opening, needles in _BRACKETED:
        if opening in plain:
            for i in (i for needle in needles for i in finds(cls, needle)):
                m = _BRACKET_AT.match(text, i - (i > 0 and text[i - 1] == " "))
                if m is not None:
                    _obfuscated_at(text, m.start(), m.end(), False, out)
    lower = s.lower
    i = lower.find(b" at ")
    while i >= 0:
        if i > 0 and text[i - 1] != " ":
            _obfuscated_at(text, i, i + 4, True, out)
        i = lower.find(b" at ", i + 1)


# --- phone numbers ------------------------------------------------------------------------------
_INTL = re.compile(r"\+[1-9][0-9]{0,2}(?:[ .-]?\([0-9]{1,4}\))?(?:[ .-]?[0-9]{1,5}){2,6}", _A)
_IDD = re.compile(r"00 ?[1-9][0-9]{0,2}(?:[ .-]?\(0\))?(?:[ .-]?[0-9]{1,5}){2,6}", _A)
_PAREN = re.compile(r"\([0-9]{2,5}\)[ .-]?[0-9]{3,4}[ .-]?[0-9]{3,5}", _A)
_US = re.compile(r"[0-9]{3}([ .-])[0-9]{3}\1[0-9]{4}", _A)
_NATIONAL = re.compile(r"0[0-9]{1,4}(?:[ /-][0-9]{2,8}(?:[ -][0-9]{2,8}){0,3}"
                       r"|\.[0-9]{2,8}(?:\.[0-9]{2,8}){0,3})", _A)
_NOT_BEFORE = "#$+.,/-_"


def _phone_at(text: str, i: int, regex: re.Pattern[str], lo: int, hi: int, out: list[Span]) -> None:
    if word_before(text, i, _NOT_BEFORE) or number_before(text, i):
        return
    m = regex.match(text, i)
    if m is not None and not number_after(text, m.end()) and lo <= digit_count(m.group()) <= hi:
        out.append(("phone", i, m.end()))


def _nanp(digits: str) -> bool:
    """A North American number: an area code that starts with 2-9 and is not a service code
    (211-911). The exchange is not checked: ``555 123 4567`` is how examples are written."""
    return digits[0] in "23456789" and digits[1:3] != "11"


def _date_like(run: str) -> bool:
    """``2024031401``: a date (YYYYMMDD...) rather than a number to call."""
    return run[:2] in ("19", "20") and "01" <= run[4:6] <= "12" and "01" <= run[6:8] <= "31"


def _us(text: str, i: int, out: list[Span]) -> None:
    """``555-123-4567``, ``555.123.4567``, ``555 123 4567`` (a valid NANP number), ``1-555-...``."""
    m = _US.match(text, i)
    if m is None or number_after(text, m.end()):
        return
    sep, start = m.group(1), i
    if i > 1 and text[i - 1] == sep and text[i - 2] == "1" and not word_before(text, i - 2):
        start = i - 2  # the country code 1 written the same way
    elif word_before(text, i, _NOT_BEFORE) or number_before(text, i):
        return
    if sep == " " and not _nanp(text[i:i + 3] + text[i + 4:i + 7]):
        return
    out.append(("phone", start, m.end()))


def _bare(text: str, cls: str, out: list[Span]) -> None:
    """Digit runs with nothing around them: ``5551234567``, ``15551234567``, ``07700900123``."""
    for i in finds(cls, "0" * 10):
        if i > 0 and cls[i - 1] == "0":
            continue
        j = i + 10
        while j < len(cls) and cls[j] == "0":
            j += 1
        run = text[i:j]
        nanp = (len(run) == 10 and _nanp(run) and not _date_like(run)) or \
            (len(run) == 11 and run[0] == "1" and _nanp(run[1:]))
        trunk = 10 <= len(run) <= 12 and run[0] == "0" and run[1] != "0"
        if not (nanp or trunk) or word_before(text, i, _NOT_BEFORE) or number_before(text, i):
            continue
        if not number_after(text, j) and not context_before(text, i, ("isbn",), 8):
            out.append(("phone", i, j))


def phones(s: Shape, out: list[Span]) -> None:
    """Append phone numbers (see the module docstring for the forms)."""
    text, cls = s.plain, s.cls
    if "+" in text:  # +44 20 7946 0958, +1 (555) 123-4567
        for i in finds(cls, "+0"):
            _phone_at(text, i, _INTL, 8, 15, out)
    if "(" in text:  # (555) 123-4567
        for i in finds(cls, "(00"):
            _phone_at(text, i, _PAREN, 9, 12, out)
    for i in finds(cls, "000-000-0000"):
        _us(text, i, out)
    # National numbers open with a trunk 0 (020 7946 0958, 030 1234567), international ones
    # with 00 (0044 20 7946 0958).
    starts = [0] if text[:1] == "0" else []
    for needle in (" 0", ":0"):
        if needle[0] in text and needle in text:
            starts.extend(i + 1 for i in finds(text, needle))
    for i in starts:
        if text.startswith("00", i):
            _phone_at(text, i, _IDD, 11, 17, out)
        else:
            _phone_at(text, i, _NATIONAL, 9, 12, out)
    if "0" * 10 in cls:
        _bare(text, cls, out)
