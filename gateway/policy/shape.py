"""The detectors' view of one text: character-class maps for C-speed searches, and span helpers.

A detector first tests a necessary condition with ``str.find`` on a map of the text (``cls``:
``000-00-0000`` is where an SSN can be), which costs one C-speed scan; a regex scan over the
text costs ten times more. Only where a needle hits does an anchored regex and a validator run.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.policy.tokens import TOKEN_MAP

Span = tuple[str, int, int]
"""``(detector, start, end)``: a half-open character range of the scanned text."""

SEPARATORS = " .-/_"
"""What people put between the digit groups of a card, phone or SSN number (after folding)."""
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# One translation serves every detector: digits become "0", ASCII letters "a", separators "-"
# (so "4111 1111.1111" is "0000-0000-0000"), ASCII whitespace other than the space "\t"
# (normalization checks for it); everything else stays as it is.
_CLASS_MAP = bytes.maketrans(
    b"0123456789" + _LETTERS + SEPARATORS.encode() + b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f",
    b"0" * 10 + b"a" * 52 + b"-" * len(SEPARATORS) + b"\t" * 9,
)


class Shape:
    """One text prepared for the detectors: ``cls`` is an ASCII string of the same length with
    every digit as ``0``, every ASCII letter as ``a`` and every separator as ``-`` (non-ASCII
    characters become ``?``, so offsets carry over). ``000-00-0000`` in ``cls`` is where an SSN
    can be, written with dashes, spaces, dots...

    Maps are built with ``bytes.translate`` (fastest) but kept as ``str``: ``bytes.find`` and
    ``in`` first try their argument as an integer and pay for a formatted ``TypeError``.
    """

    __slots__ = ("_lower", "_tokens", "_urls", "cls", "plain", "raw", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.raw = text.encode("ascii", "replace")
        self.plain = text if text.isascii() else self.raw.decode("ascii")
        """``text`` with every non-ASCII character as ``?``: the detectors that look only at
        ASCII characters (all but e-mail) search this, at the speed of one byte a character."""
        self.cls = self.raw.translate(_CLASS_MAP).decode("ascii")
        self._tokens: str | None = None
        self._lower: bytes | None = None
        self._urls: list[int] | None = None

    @property
    def tokens(self) -> str:
        """Token characters as ``a``, everything else as a space."""
        if self._tokens is None:
            self._tokens = self.raw.translate(TOKEN_MAP).decode("ascii")
        return self._tokens


    @property
    def lower(self) -> bytes:
        """``raw`` in lower case (ASCII letters only: one byte a character, offsets carry over)."""
        if self._lower is None:
            self._lower = self.raw.lower()
        return self._lower


    @property
    def urls(self) -> list[int]:
        """Where ``://`` is (a URL's scheme ends there)."""
        if self._urls is None:
            self._urls = list(finds(self.plain, "://")) if ":" in self.plain else []
        return self._urls


def finds(hay: str, needle: str) -> Iterator[int]:
    """Every index where ``needle`` starts in ``hay`` (overlapping)."""
    i = hay.find(needle)
    while i >= 0:
        yield i
        i = hay.find(needle, i + 1)


def digit_count(s: str) -> int:
    """The number of digits in ``s``."""
    return sum(map(str.isdigit, s))


def word_before(text: str, i: int, also: str = "") -> bool:
    """Whether ``text[i-1]`` continues a word/number (so a match at ``i`` starts mid-token)."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in also)


def number_before(text: str, i: int) -> bool:
    """Whether ``i`` starts a later group of a longer number (``1234 5678``: the ``5678``, but
    not in ``visa13 5678``, where the digits end a word)."""
    if i < 2 or text[i - 1] not in SEPARATORS or not text[i - 2].isdigit():
        return False
    j = i - 2
    while j > 0 and text[j - 1].isdigit():
        j -= 1
    return j == 0 or not text[j - 1].isalpha()


def number_after(text: str, j: int) -> bool:
    """Whether a number continues at ``j`` (``5``, ``.5``, ``-5``...): the match was cut short."""
    if j >= len(text):
        return False
    c = text[j]
    return c.isalnum() or (c in ".,-/_" and j + 1 < len(text) and text[j + 1].isdigit())


def context_before(text: str, i: int, words: tuple[str, ...], width: int = 32) -> bool:
    """Whether one of ``words`` (lower case) ends within ``width`` characters before ``i``."""
    window = text[max(0, i - width):i].lower()
    return any(w in window for w in words)
