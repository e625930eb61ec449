"""Secrets told by what surrounds them rather than by their shape alone (``tokens`` has those).

- ``password=...`` pairs: a key (``password``, ``passwd``, ``passphrase``, ``pwd``, ``pass``
  with ``=`` only, ``api_key``, ``access_token``, ``client_secret``, ``secret_access_key``...,
  also at the end of a longer name: ``DB_PASSWORD``, ``aws_secret_access_key``), ``=`` or ``:``,
  a value. With ``:`` (prose writes "Password: see below") the value must be quoted or hold a
  digit or symbol. Placeholders (``<password>``, ``${PASS}``, ``****``, ``YOUR_API_KEY``) are
  not secrets.
- HTTP Basic credentials: ``Basic <base64>`` that decodes to ``user:password`` (or follows
  ``Authorization``, for case-folded text), and ``scheme://user:password@host`` in URLs.
- AWS secret access keys: 40 base64 characters in a text that also holds an access key id
  (``AKIA...``) or the key's name.
- Unsigned JWTs (``alg: none``): ``header.payload.`` with an empty signature.
"""

from __future__ import annotations

import binascii
import re

from gateway.policy.shape import Shape, Span, context_before, finds, word_before
from gateway.policy.tokens import LONG_RUN

_A = re.ASCII
_KEYS = ("password", "passwd", "passphrase", "pwd", "pass", "api_key", "apikey", "api-key",
         "access_token", "auth_token", "client_secret", "secret_key", "secret_access_key",
         "secretaccesskey")


def _after_key(sep: bytes) -> re.Pattern[bytes]:
    """``sep`` after a key's last three letters, perhaps with a quote or space between (on the
    lower-case text): a literal first character and look-behinds, so the scan stays in C."""
    ends = b"|".join(sorted({key[-3:].encode() for key in _KEYS}))
    behind = b"|".join(b"(?<=(?:%s)%s%s)" % (ends, gap, sep)
                       for gap in (b"", b"[\"' ]", b"[\"' ]{2}"))
    return re.compile(b"%s(?:%s)" % (sep, behind))


_EQUALS, _COLON = _after_key(b"="), _after_key(b":")
_VALUE = re.compile(r"[^\s\"'&;,]{3,128}")
_QUOTED = re.compile(r"\"([^\"]{3,128})\"|'([^']{3,128})'")
_PLACEHOLDER_START = tuple("<${%*[(")
_CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_NOT_VALUES = frozenset({"null", "none", "true", "false", "undefined", "empty", "required"})
_BASIC = re.compile(r"(?i:basic) +([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])", _A)
_USERINFO = re.compile(r"[^\s/?#@:]+:([^\s/?#@]+)@")
_AWS_ID = re.compile(r"(?:AKIA|ASIA|akia|asia)[0-9A-Za-z]{16}(?![0-9A-Za-z])", _A)
_AWS_NAMES = ("secret_access_key", "secretaccesskey", "SECRET_ACCESS_KEY", "SecretAccessKey")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])", _A)
_UNSIGNED_JWT = re.compile(r"ey[Jj][A-Za-z0-9_-]{8,}\.ey[Jj][A-Za-z0-9_-]{8,}\.(?![A-Za-z0-9_-])",
                           _A)


def _placeholder(value: str) -> bool:
    """``<password>``, ``${PASS}``, ``****``, ``YOUR_API_KEY``: not a value but a stand-in."""
    return value.startswith(_PLACEHOLDER_START) or value.strip("xX*.") == "" \
        or value.lower() in _NOT_VALUES or _CONSTANT_NAME.fullmatch(value) is not None


def _pair_at(text: str, p: int, out: list[Span]) -> None:
    """A ``key=value`` / ``key: value`` pair whose separator is ``text[p]``."""
    k = p
    while k > 0 and p - k < 2 and text[k - 1] in " \"'":
        k -= 1
    window = text[max(0, k - 20):k].lower()
    if not window.endswith(_KEYS):
        return
    key = next(key for key in _KEYS if window.endswith(key))
    if word_before(text, k - len(key)) or (key == "pass" and text[p] == ":"):
        return
    v = p + 1
    while v < len(text) and v - p <= 2 and text[v] == " ":
        v += 1
    quoted = _QUOTED.match(text, v)
    if quoted is not None:
        start, end = quoted.span(1) if quoted.group(1) is not None else quoted.span(2)
    else:
        m = _VALUE.match(text, v)
        if m is None:
            return
        start, end = m.span()
        while end > start and text[end - 1] in ".)]}":  # sentence punctuation, not the value
            end -= 1
        if text[p] == ":" and text[start:end].isalpha():
            return  # "Password: reset it from the login page"
    if end - start >= 3 and not _placeholder(text[start:end]):
        out.append(("secret", start, end))


def _basic(s: Shape, out: list[Span]) -> None:
    text, lower = s.plain, s.lower
    i = lower.find(b"basic ")
    while i >= 0:
        m = _BASIC.match(text, i)
        i = lower.find(b"basic ", i + 1)
        if m is None or word_before(text, m.start()):
            continue
        value = m.group(1)
        try:
            decoded = binascii.a2b_base64(value + "=" * (-len(value) % 4), strict_mode=True)
            creds = decoded.decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            creds = ""
        if (creds.isprintable() and ":" in creds[1:]) or \
                context_before(text, m.start(), ("authorization",), 24):
            out.append(("secret", m.start(1), m.end(1)))


def _url_password(text: str, i: int, out: list[Span]) -> None:
    """``user:password@`` after the ``://`` at ``i``."""
    m = _USERINFO.match(text, i + 3)
    if m is not None and not _placeholder(m.group(1)):
        out.append(("secret", i + 3, m.end() - 1))


def _aws_secrets(text: str, out: list[Span]) -> None:
    named = any(name in text for name in _AWS_NAMES)
    if not named and not any(_AWS_ID.match(text, i) for prefix in ("AKIA", "ASIA", "akia", "asia")
                             for i in finds(text, prefix)):
        return
    for m in _AWS_SECRET.finditer(text):
        key = m.group()
        if any(c.isdigit() or c in "/+" for c in key) and not key.isalpha():
            out.append(("secret", m.start(), m.end()))


_LONG_40 = "a" * 40


def find_credentials(s: Shape, out: list[Span]) -> None:
    """Append the secrets this module describes."""
    text = s.plain
    lower = s.lower
    for sep, pairs in ((b"=", _EQUALS), (b":", _COLON)):
        if sep in lower:
            for m in pairs.finditer(lower):
                _pair_at(text, m.start(), out)
    if ":" in text:  # s.urls is empty otherwise
        for i in s.urls:
            _url_password(text, i, out)
    if b"basic " in lower:  # the one needle _basic searches for
        _basic(s, out)
    tokens = s.tokens
    if LONG_RUN not in tokens:
        return  # both of the following are runs of 20+ token characters
    if _LONG_40 in tokens:
        _aws_secrets(text, out)
    for prefix in ("eyJ", "eyj"):
        for i in finds(text, prefix):
            jwt = None if word_before(text, i) else _UNSIGNED_JWT.match(text, i)
            if jwt is not None:
                out.append(("secret", i, jwt.end()))
