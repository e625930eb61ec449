"""Secrets in text: API keys, access tokens, JWTs, bearer tokens, long random hex/base64 strings.

Secrets hide in runs of token characters (letters, digits, ``+/=_.~-``) at least 20 long; the
caller finds those runs with a ``str.find`` on a token map of the text (``TOKEN_MAP``), so prose
costs one search. Inside a run: known formats by prefix (``sk-``, ``ghp_``, ``AKIA``, ``xoxb-``,
JWT ``eyJ..``), a token right after ``Bearer``, and otherwise strings of 32+ characters that look
random (digits mixed in, high Shannon entropy) rather than like words or identifiers.
"""

from __future__ import annotations

import math
import re
from collections import Counter

Span = tuple[str, int, int]
_A = re.ASCII
# Characters of API keys, tokens, JWTs and base64: bytes.translate() maps them to "a".
_TOKEN_CHARS = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_.~-")
TOKEN_MAP = bytes(0x61 if i in _TOKEN_CHARS else 0x20 for i in range(256))
LONG_RUN = "a" * 20
"""The shortest run a secret can be (``AKIA`` + 16); shorter runs are never examined."""

# Known token formats. Case variants cover text that the policy case-folded.
_PREFIXED = re.compile(
    r"sk-[A-Za-z0-9_-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|github_pat_[A-Za-z0-9_]{22,}|(?:AKIA|ASIA)[0-9A-Z]{16}|(?:akia|asia)[0-9a-z]{16}"
    r"|xox[baprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{20,}|(?:AIza|aiza)[0-9A-Za-z_-]{35}"
    r"|ey[Jj][A-Za-z0-9_-]{8,}\.ey[Jj][A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", _A)
_BEARER = re.compile(r"(?i:bearer)\s+\Z")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{32,}", _A)
_PIECES = re.compile(r"[A-Za-z0-9+/_-]{32,}", _A)


def _digits(s: str) -> int:
    return sum(map(str.isdigit, s))


def _mid_word(text: str, i: int) -> bool:
    return i > 0 and text[i - 1].isalnum()


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _random_looking(s: str, hex_only: bool) -> bool:
    digits = _digits(s)
    if hex_only:
        return 0 < digits < len(s) and _entropy(s) >= 3.0
    if digits < 2:
        return False
    # Random base64 mixes cases; case-folded or base36 tokens make up for it with many digits.
    # Long identifiers (snake_case_names_2024) have one case and few digits.
    mixed = any(c.isupper() for c in s) and any(c.islower() for c in s)
    return (mixed or digits * 4 >= len(s)) and _entropy(s) >= 4.0


def _in_run(text: str, i: int, j: int, out: list[Span]) -> None:
    """Secrets inside one run of token characters ``text[i:j]``."""
    for m in _PREFIXED.finditer(text, i, j):
        # A real key's random part has digits ("sk-learn-is-great" has none); AWS ids may not.
        if not _mid_word(text, m.start()) and (m.group()[:4].isupper() or _digits(m.group()[4:])):
            out.append(("secret", m.start(), m.end()))
    if _BEARER.search(text, max(0, i - 16), i) is not None:
        out.append(("secret", i, j))
    if j - i >= 32:
        for m in _HEX_RUN.finditer(text, i, j):
            if not _mid_word(text, m.start()) and _random_looking(m.group(), True):
                out.append(("secret", m.start(), m.end()))
        for m in _PIECES.finditer(text, i, j):
            if _random_looking(m.group(), False):
                out.append(("secret", m.start(), m.end()))


def find_secrets(text: str, tokens: str, out: list[Span]) -> None:
    """Append ``("secret", start, end)`` spans; ``tokens`` is ``text`` mapped by ``TOKEN_MAP``."""
    i = tokens.find(LONG_RUN)
    while i >= 0:
        j = tokens.find(" ", i)
        j = len(tokens) if j < 0 else j
        _in_run(text, i, j, out)
        i = tokens.find(LONG_RUN, j)
