"""Privacy detectors: find e-mail addresses, phone numbers, cards, SSNs, IBANs, IPs and secrets.

Pure functions over ``str``. ``scan`` returns the spans found, ``redact`` masks them. Detection has
to cost microseconds on the cache-hit path, so each detector works in two steps:

1. A necessary condition tested with C-speed substring searches on a *shape* of the text, built
   once: the text as one byte per character with every ASCII digit turned into ``0`` (a card is
   ``0000 0000 0000 0000``, an SSN ``000-00-0000``). Text without that shape costs one search.
2. Only at the positions those searches find, an anchored regex and a validator (Luhn, mod-97,
   ``ipaddress``, entropy) that separates real values from look-alikes (years, prices, order ids).

The detectors see a folded copy of the text (``fold``: full-width and other-script digits as
ASCII, zero-width characters removed, Unicode dashes as ``-``...); findings are half-open
character ranges into the given text, mapped back where folding changed lengths.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gateway.policy.detectors import Shape, detect
from gateway.policy.fold import fold
from gateway.policy.model import DETECTOR_NAMES

DETECTORS: tuple[str, ...] = DETECTOR_NAMES
LABELS: dict[str, str] = {
    "email": "[EMAIL]", "phone": "[PHONE]", "card": "[CARD]", "us_ssn": "[SSN]",
    "iban": "[IBAN]", "ip": "[IP]", "secret": "[SECRET]",
}

@dataclass(frozen=True, slots=True)
class Finding:
    """One detector hit: ``text[start:end]`` looked like the detector's kind of data."""

    detector: str
    start: int
    end: int


def scan(text: str, detectors: Collection[str]) -> list[Finding]:
    """Every span of ``text`` that one of ``detectors`` recognises, ordered by position (the
    longer first where two start together).

    Spans of one detector never overlap each other; spans of different detectors may.
    """
    if not text or not detectors:
        return []
    folded = fold(text)
    found = scan_shape(Shape(folded.text), detectors)
    if folded.resized and found:
        found = [Finding(f.detector, *folded.span(f.start, f.end)) for f in found]
    return found


def scan_shape(shape: Shape, detectors: Collection[str]) -> list[Finding]:
    """``scan`` for a text whose ``Shape`` the caller already built (of an ASCII text, which
    folding leaves as it is)."""
    spans = detect(shape, detectors)
    if not spans:
        return []
    spans.sort(key=lambda s: (s[0], s[1], -s[2]))
    found: list[Finding] = []
    # One value can be seen by two forms (+44 20... and 020...): merge a detector's overlaps.
    name, start, end = spans[0]
    for n, s, e in spans[1:]:
        if n == name and s < end:
            end = max(end, e)
        else:
            found.append(Finding(name, start, end))
            name, start, end = n, s, e
    found.append(Finding(name, start, end))
    if len(found) > 1:
        found.sort(key=lambda f: (f.start, -f.end))
    return found


def redact(text: str, findings: Sequence[Finding]) -> str:
    """``text`` with every finding replaced by its label (``[EMAIL]``...); overlaps merge."""
    if not findings:
        return text
    ordered = sorted(findings, key=lambda f: (f.start, -f.end))
    parts: list[str] = []
    pos = 0
    label = ""
    span_end = -1
    for f in ordered:
        if f.start < span_end:  # overlaps the span being masked: widen it
            span_end = max(span_end, f.end)
            continue
        if span_end >= 0:
            parts.append(label)
            pos = span_end
        parts.append(text[pos:f.start])
        label, span_end = LABELS[f.detector], f.end
    parts.append(label)
    parts.append(text[span_end:])
    return "".join(parts)
