"""The detectors' copy of a text: look-alike characters folded to ASCII, invisible ones removed.

PII written with full-width or other-script digits (U+FF14, Arabic-Indic U+0664...), a
full-width at-sign or plus (U+FF20, U+FF0B), Unicode dashes, dots and slashes between digit
groups, or zero-width characters inside (``john\\u200b@example.com``) reads the same to a person
as its ASCII form. ``fold`` returns that ASCII form for the detectors only: the backend and the
cache key keep the normalised text.

Per character: format characters (category Cf: zero-width space and joiners, word joiner, BOM,
soft hyphen, bidi controls) are removed; Unicode decimal digits become ASCII digits; dashes
(category Pd, minus sign) become ``-``; middle dots and ideographic full stops ``.``; division
and fraction slashes ``/``; every space separator ``" "``; any other character whose NFKC form is
one ASCII character (full-width letters and symbols, mathematical letters) becomes that
character, and the Latin ligatures (``ﬁ``) their letters. Numeric characters that are not decimal
digits (``²``, ``½``, ``①``) stay: folding them would glue them to their neighbours (``10²``).

ASCII text, the common case, is returned as it is. Other text costs one regex scan for a
foldable character, then one ``str.replace`` per distinct foldable character found (at most
``_MAX_DISTINCT`` of them, past that one ``str.translate``). When folding removed or expanded
characters, ``Folded.span`` maps a span of the folded text back to the original.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from itertools import chain, repeat

_DOTS = "\u00b7\u0387\u2024\u2027\u2219\u22c5\u3002\u30fb\ufe52\uff0e\uff61\uff65"
_SLASHES = "\u2044\u2215\u29f8\uff0f"
_DASHES = "\u2212\u2043\u2796\ufe58\ufe63\uff0d"
_UNDERSCORES = "\u2017\ufe4d\ufe4e\ufe4f\uff3f"
_LIGATURES = range(0xFB00, 0xFB07)  # ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ
# Code points where anything folds: the BMP, the supplementary multilingual plane
# (mathematical letters and digits, other-script digits, format characters) and the tags.
_PLANES = (range(0x80, 0x20000), range(0xE0000, 0xE1000))
_MAX_DISTINCT = 16
_SOFT_HYPHEN = "\u00ad"
# The foldable characters below U+0100 (checked by the Latin-1 fast path, and by a test).
_LATIN1_FOLDABLE = "\u00a0\u00aa\u00ad\u00b7\u00ba"


def _fold_char(c: str) -> str | None:
    """What ``c`` folds to, or None when it stays as it is."""
    category = unicodedata.category(c)
    if category == "Cf":
        return ""
    if category == "Nd":
        return str(unicodedata.decimal(c))
    if category == "Pd" or c in _DASHES:
        return "-"
    if category == "Zs":
        return " "
    for chars, ascii_char in ((_DOTS, "."), (_SLASHES, "/"), (_UNDERSCORES, "_")):
        if c in chars:
            return ascii_char
    if not unicodedata.decomposition(c) or unicodedata.numeric(c, None) is not None:
        return None
    nfkc = unicodedata.normalize("NFKC", c)
    if nfkc.isascii() and (len(nfkc) == 1 or ord(c) in _LIGATURES):
        return nfkc
    return None


def _char_class(code_points: list[int], gap: int = 1) -> str:
    """A regex character class body for ``code_points``, as ranges (joined across ``gap``)."""
    ranges: list[str] = []
    first = last = code_points[0]
    for cp in [*code_points[1:], -1]:
        if 0 < cp - last <= gap:
            last = cp
            continue
        ranges.append(re.escape(chr(first)) if first == last
                      else f"{re.escape(chr(first))}-{re.escape(chr(last))}")
        first = last = cp
    return "".join(ranges)


@functools.cache
def _tables() -> tuple[dict[int, str], re.Pattern[str], re.Pattern[str]]:
    """The fold table (code point -> replacement) and two regexes for a foldable character:
    one for text within the BMP (exact), one for any text (astral ranges coarsened: a
    character class with many ranges outside the BMP costs per character scanned).

    Built on the first non-ASCII text (~40 ms once): a scan of the Unicode database, so it
    follows the running Python's Unicode version.
    """
    table: dict[int, str] = {}
    for plane in _PLANES:
        for cp in plane:
            folded = _fold_char(chr(cp))
            if folded is not None:
                table[cp] = folded
    bmp = _char_class(sorted(cp for cp in table if cp <= 0xFFFF))
    astral = _char_class(sorted(cp for cp in table if cp > 0xFFFF), gap=1024)
    return table, re.compile(f"[{bmp}]"), re.compile(f"[{bmp}{astral}]")


class Folded:
    """A folded text (``text``) and how to map its spans back to the ``source`` text."""

    __slots__ = ("_index", "resized", "source", "text")

    def __init__(self, source: str, text: str, resized: bool) -> None:
        self.source = source
        self.text = text
        self.resized = resized
        """Whether characters were removed or expanded (offsets then differ)."""
        self._index: list[int] | None = None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of ``source`` that ``text[start:end]`` came from (``start < end``)."""
        if not self.resized:
            return start, end
        if self._index is None:
            # Built only when a finding needs it: the source position of every folded character.
            table = _tables()[0]
            lengths = [len(table.get(ord(c), c)) for c in self.source]
            self._index = list(chain.from_iterable(map(repeat, range(len(lengths)), lengths)))
        return self._index[start], self._index[end - 1] + 1


def fold(text: str) -> Folded:
    """The detectors' copy of ``text`` (see the module docstring); ``text`` itself if ASCII."""
    if text.isascii():
        return Folded(text, text, False)
    table, bmp, anywhere = _tables()
    try:
        text.encode("latin-1")  # a cheap copy when every character is below U+0100...
    except UnicodeEncodeError:
        # ...else one regex scan; UTF-16 is longer than two bytes a character only when
        # characters outside the BMP are there.
        foldable = bmp if len(text.encode("utf-16-le")) == 2 * len(text) else anywhere
    else:
        return _fold_latin1(text, table)
    out, resized, pos, distinct = text, False, 0, 0
    while (m := foldable.search(out, pos)) is not None:
        c = m.group()
        replacement = table.get(ord(c))
        if replacement is None:  # in a coarse astral range, but stays
            pos = m.end()
            continue
        distinct += 1
        if distinct > _MAX_DISTINCT:  # many kinds of foldable character: one linear pass
            return Folded(text, text.translate(table), _changes_length(text, table))
        out = out.replace(c, replacement)  # every occurrence at once, at C speed
        if len(replacement) == 1:
            pos = m.start() + 1
        else:
            resized, pos = True, m.start()
    return Folded(text, out, resized)


def _fold_latin1(text: str, table: dict[int, str]) -> Folded:
    out, resized = text, False
    for c in _LATIN1_FOLDABLE:
        if c in out:
            out = out.replace(c, table[ord(c)])
            resized = resized or c == _SOFT_HYPHEN
    return Folded(text, out, resized)


def _changes_length(text: str, table: dict[int, str]) -> bool:
    return any(len(table.get(ord(c), c)) != 1 for c in set(text))
