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

ASCII text, the common case, is returned as it is. Text that fits in Latin-1 or Windows-1252
costs one encode and a ``str.replace`` per foldable character present (at most seven exist there).
Other text costs one regex scan for a foldable character, then one ``str.replace`` per distinct
foldable character found (at most ``_MAX_DISTINCT`` of them, past that one ``str.translate``).
When folding removed or expanded characters, ``Folded.span`` maps a span of the folded text back
to the original. The tables are built from ``unicodedata`` on the first non-ASCII text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from itertools import repeat

_DOTS = "\u00b7\u0387\u2024\u2027\u2219\u22c5\u3002\u30fb\ufe52\uff0e\uff61\uff65"
_SLASHES = "\u2044\u2215\u29f8\uff0f"
_DASHES = "\u2212\u2043\u2796\ufe58\ufe63\uff0d"
_UNDERSCORES = "\u2017\ufe4d\ufe4e\ufe4f\uff3f"
_LIGATURES = range(0xFB00, 0xFB07)  # ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ
# Code points where anything folds: the BMP, the supplementary multilingual plane
# (mathematical letters and digits, other-script digits, format characters) and the tags.
_PLANES = (range(0x80, 0x20000), range(0xE0000, 0xE1000))
_MAX_DISTINCT = 16


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


@dataclass(frozen=True, slots=True)
class _Tables:
    """Everything ``fold`` looks up, built once."""

    table: dict[int, str]
    """Code point -> what it folds to."""
    bmp: re.Pattern[str]
    """One foldable character, for text within the BMP (exact)."""
    anywhere: re.Pattern[str]
    """The same for any text (ranges outside the BMP coarsened: a character class with many
    ranges there costs per character scanned)."""
    resizing: re.Pattern[str]
    """One character that folds to more or fewer than one (format characters, ligatures)."""
    latin1: str
    """The foldable characters below U+0100."""
    cp1252: str
    """The foldable characters of Windows-1252, which most Western text fits in."""


@functools.cache
def _tables() -> _Tables:
    """The fold table and what finds its characters fast.

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
    resizing = _char_class(sorted(cp for cp, folded in table.items() if len(folded) != 1))
    cp1252 = bytes(range(0x80, 0x100)).decode("cp1252", errors="ignore")
    return _Tables(table, re.compile(f"[{bmp}]"), re.compile(f"[{bmp}{astral}]"),
                   re.compile(f"[{resizing}]"),
                   "".join(chr(cp) for cp in range(0x80, 0x100) if cp in table),
                   "".join(c for c in cp1252 if ord(c) in table))


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
            t = _tables()
            index: list[int] = []
            pos = 0
            for m in t.resizing.finditer(self.source):
                i = m.start()
                index.extend(range(pos, i))
                index.extend(repeat(i, len(t.table[ord(m.group())])))
                pos = i + 1
            index.extend(range(pos, len(self.source)))
            self._index = index
        return self._index[start], self._index[end - 1] + 1


def prepare() -> None:
    """Build the fold tables now (about 45 ms, once per process) rather than on the first
    non-ASCII request; the gateway calls it off the event loop at start-up."""
    _tables()


def fold(text: str) -> Folded:
    """The detectors' copy of ``text`` (see the module docstring); ``text`` itself if ASCII."""
    if text.isascii():
        return Folded(text, text, False)
    t = _tables()
    # Most text fits in Latin-1 or Windows-1252, which hold a handful of foldable characters:
    # an encode (at C speed, stops at the first character outside) says whether it does.
    for encoding, few in (("latin-1", t.latin1), ("cp1252", t.cp1252)):
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            continue
        return _fold_few(text, few, t.table)
    # Else one regex scan. UTF-16 is longer than two bytes a character only when characters
    # outside the BMP are there.
    foldable = t.bmp if len(text.encode("utf-16-le")) == 2 * len(text) else t.anywhere
    table = t.table
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


def _fold_few(text: str, chars: str, table: dict[int, str]) -> Folded:
    """``fold`` for a text whose only foldable characters can be ``chars``."""
    out, resized = text, False
    for c in chars:
        if c in out:
            replacement = table[ord(c)]
            out = out.replace(c, replacement)
            resized = resized or len(replacement) != 1
    return Folded(text, out, resized)


def _changes_length(text: str, table: dict[int, str]) -> bool:
    return any(len(table.get(ord(c), c)) != 1 for c in set(text))
