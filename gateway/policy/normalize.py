"""Text normalization: the canonical form a text takes before the backend, detectors and key see it.

Steps, in order: Unicode normalization form, case folding, whitespace (collapse every run of
Unicode whitespace to one space and strip, or only strip, or keep), then the length limit
(truncate, or reject with a 422 naming the field). ASCII text, the common case, skips
``unicodedata`` entirely and is returned unchanged, without copying, when it is already canonical.
The result is idempotent: normalizing a normalized text returns it unchanged.
"""

from __future__ import annotations

import unicodedata

from gateway.errors import ValidationFailed
from gateway.policy.model import Normalization


def _collapse(text: str) -> str:
    # Text that is already collapsed is returned as is: isprintable() is False for every
    # whitespace character but the space, so these C-speed checks spare the split/join.
    if "  " not in text and text.isprintable() and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


def _unicode_steps(text: str, n: Normalization) -> str:
    form = n.unicode_form
    if form != "none" and not unicodedata.is_normalized(form, text):
        text = unicodedata.normalize(form, text)
    if n.casefold:
        folded = text.casefold()
        if folded != text and form != "none":
            # Case folding can produce sequences that are no longer in the normal form.
            folded = unicodedata.normalize(form, folded)
        text = folded
    return text


def canonical(text: str, n: Normalization) -> str:
    """Every normalization step except the length limit."""
    if text.isascii():
        if n.casefold:
            text = text.lower()
    else:
        text = _unicode_steps(text, n)
    if n.whitespace == "collapse":
        return _collapse(text)
    if n.whitespace == "strip":
        return text.strip()
    return text


def limit(text: str, n: Normalization, *, field: str = "input") -> str:
    """Apply ``max_chars``: truncate (then drop whitespace the cut exposed) or reject."""
    if len(text) <= n.max_chars:
        return text
    if n.on_overflow == "reject":
        raise ValidationFailed(
            field, f"longer than {n.max_chars} characters after normalization ({len(text)})"
        )
    text = text[: n.max_chars]
    return text if n.whitespace == "keep" else text.rstrip()


def normalize_text(text: str, n: Normalization, *, field: str = "input") -> str:
    """The canonical form of ``text`` under ``n``; ``field`` names the input in a 422."""
    return limit(canonical(text, n), n, field=field)
