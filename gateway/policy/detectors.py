"""The individual PII detectors behind ``pii.scan``, and ``detect``, which runs the wanted ones.

``detect`` runs them over a ``Shape`` of the (folded, see ``fold``) text and returns
``(detector, start, end)`` spans. On the hot path (text with no PII) a detector costs a few
``str.find`` calls on the shape, each a C-speed scan: a regex scan over the text costs ten times
more. Only where a needle hits does an anchored regex run, followed by a validator (Luhn,
mod-97, ``ipaddress``, base64). The detectors live by kind of data: ``contacts`` (e-mail, phone),
``numbers`` (card, SSN, IBAN), ``netaddr`` (IP), ``tokens`` and ``credentials`` (secrets).
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.policy.contacts import emails, phones
from gateway.policy.credentials import find_credentials
from gateway.policy.netaddr import ipv4s, ipv6s, url_hosts
from gateway.policy.numbers import cards, iban_valid, ibans, luhn_valid, ssns
from gateway.policy.shape import Shape, Span
from gateway.policy.tokens import LONG_RUN, find_secrets

__all__ = ["Shape", "Span", "detect", "iban_valid", "luhn_valid"]


def detect(s: Shape, want: Collection[str]) -> list[Span]:
    """Every span the wanted detectors find, unordered; cheap necessary conditions first."""
    out: list[Span] = []
    text, cls = s.plain, s.cls
    if "email" in want:
        emails(s, out)
    digits = cls.count("0") if "0" in cls else 0
    if digits >= 8:  # every phone, card, SSN and IBAN has at least 8 digits
        if "card" in want:
            cards(s, out)
        if "us_ssn" in want:
            ssns(s, out)
        if "phone" in want:
            phones(s, out)
        if "iban" in want and ("0000-0000" in cls or "0" * 8 in cls) and "aa00" in cls:
            ibans(s, out)
    if "ip" in want:
        if digits >= 4 and "." in text:
            ipv4s(s, out)
        if ":" in text:
            ipv6s(s, out)
            url_hosts(s, out)
    if "secret" in want:
        tokens = s.tokens
        if LONG_RUN in tokens:
            find_secrets(text, tokens, out)
        find_credentials(s, out)
    return out
