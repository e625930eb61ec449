"""The cache policy as values: rules matched in order, each saying what may be cached and how.

A ``Policy`` is an ordered tuple of ``Rule``s; the first rule whose ``Match`` fits the request
(route, model, tenant, headers) decides. Every class here is a frozen, slotted, keyword-only
dataclass that validates itself on construction, so a ``Policy`` that exists is a valid one.
Nothing here does I/O: files become these values in ``loader``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from types import MappingProxyType
from typing import Literal, get_args

from gateway.policy.headers import RequestHeaders, candidates

UnicodeForm = Literal["NFC", "NFKC", "NFD", "NFKD", "none"]
WhitespaceMode = Literal["collapse", "strip", "keep"]
Overflow = Literal["truncate", "reject"]
Action = Literal["no_store", "redact", "reject"]
Scope = Literal["tenant", "shared"]

ACTIONS: tuple[str, ...] = get_args(Action)
# Kept here (not imported from pii) so the model stays importable without compiling regexes.
DETECTOR_NAMES: tuple[str, ...] = ("email", "phone", "card", "us_ssn", "iban", "ip", "secret")
SHARED_SCOPE = "shared"
Headers = Mapping[str, str | tuple[str, ...]]
"""Request headers by lowercase name: one value each (a plain dict), or every value
(``RequestHeaders``, what the gateway passes)."""


def _check(value: object, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Normalization:
    """How a text is canonicalised before the backend, the detectors and the cache key see it."""

    unicode_form: UnicodeForm = "NFC"
    casefold: bool = False
    whitespace: WhitespaceMode = "collapse"
    max_chars: int = 8192
    on_overflow: Overflow = "truncate"
    max_items: int = 256
    fingerprint: str = field(init=False, repr=False, compare=False)
    """Short stable hash of the fields that change the text; part of every cache key."""

    def __post_init__(self) -> None:
        _check(self.unicode_form, get_args(UnicodeForm), "unicode_form")
        _check(self.whitespace, get_args(WhitespaceMode), "whitespace")
        _check(self.on_overflow, get_args(Overflow), "on_overflow")
        if self.max_chars < 1 or self.max_items < 1:
            raise ValueError("max_chars and max_items must be at least 1")
        # on_overflow and max_items never change an accepted text, so they stay out of the
        # fingerprint: tightening a limit must not throw away every cached entry.
        spec = f"n1|{self.unicode_form}|{int(self.casefold)}|{self.whitespace}|{self.max_chars}"
        object.__setattr__(self, "fingerprint", hashlib.sha256(spec.encode()).hexdigest()[:12])


@dataclass(frozen=True, slots=True, kw_only=True)
class Privacy:
    """Which PII detectors run on each (normalized) text, and what a hit does."""

    detectors: Mapping[str, Action] = field(default_factory=dict)
    names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, action in self.detectors.items():
            _check(name, DETECTOR_NAMES, "detector")
            _check(action, ACTIONS, f"action of detector {name!r}")
        object.__setattr__(self, "detectors", MappingProxyType(dict(self.detectors)))
        object.__setattr__(self, "names", frozenset(self.detectors))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.detectors.items())))


class _Patterns:
    """Exact names and ``fnmatch`` globs, compiled once: is a value one of them?"""

    __slots__ = ("exact", "glob")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        globs = [p for p in patterns if any(c in p for c in "*?[")]
        self.exact = frozenset(p for p in patterns if p not in globs)
        self.glob: Callable[[str], object] | None = (
            re.compile("|".join(f"(?:{translate(g)})" for g in globs)).match if globs else None
        )

    def __call__(self, value: str) -> bool:
        if value in self.exact:
            return True
        return self.glob is not None and self.glob(value) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Match:
    """Which requests a rule applies to. ``None`` means any; names may be ``fnmatch`` globs.

    ``headers`` maps a lowercase header name to an exact value or a glob; every listed header
    must be present and match. A header sent more than once matches when any of its values
    (or any comma-separated element of one) does (``gateway.policy.headers``).
    """

    routes: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None
    tenants: tuple[str, ...] | None = None
    headers: Mapping[str, str] | None = None
    _tests: tuple[tuple[str, _Patterns], ...] = field(init=False, repr=False, compare=False)
    _header_tests: tuple[tuple[str, _Patterns], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        tests = []
        for name in ("routes", "models", "tenants"):
            values = getattr(self, name)
            if values is not None:
                object.__setattr__(self, name, tuple(values))
                tests.append((name, _Patterns(tuple(values))))
        object.__setattr__(self, "_tests", tuple(tests))
        headers: tuple[tuple[str, _Patterns], ...] = ()
        if self.headers is not None:
            lowered = {k.lower(): v for k, v in self.headers.items()}
            object.__setattr__(self, "headers", MappingProxyType(lowered))
            headers = tuple((k, _Patterns((v,))) for k, v in lowered.items())
        object.__setattr__(self, "_header_tests", headers)

    def __hash__(self) -> int:
        headers = None if self.headers is None else tuple(sorted(self.headers.items()))
        return hash((self.routes, self.models, self.tenants, headers))

    @property
    def matches_everything(self) -> bool:
        """True when no condition narrows the match (rules after this one are unreachable)."""
        if self.headers:
            return False
        return all(v is None or "*" in v for v in (self.routes, self.models, self.tenants))

    def matches(self, *, route: str, model: str, tenant: str, headers: Headers) -> bool:
        """Whether a request with these attributes falls under this match."""
        for name, test in self._tests:
            value = route if name == "routes" else model if name == "models" else tenant
            if not test(value):
                return False
        for hname, htest in self._header_tests:
            if not any(htest(v) for v in candidates(_header(headers, hname))):
                return False
        return True


def _header(headers: Headers, name: str) -> tuple[str, ...]:
    """Every value of ``name``: a plain dict gives one, ``RequestHeaders`` all of them."""
    if isinstance(headers, RequestHeaders):
        return headers.values_of(name)
    value = headers.get(name)
    if value is None:
        # Plain dicts with mixed-case names: fall back to a scan (only for rules on headers).
        for key, v in headers.items():
            if key.lower() == name:
                value = v
                break
        else:
            return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One policy rule: where it applies, and what caching, scope, staleness and privacy mean."""

    name: str
    match: Match = field(default_factory=Match)
    cache: bool = True
    scope: Scope = "tenant"
    ttl_s: float = 3600.0
    stale_while_revalidate_s: float = 0.0
    stale_if_error_s: float = 0.0
    normalization: Normalization = field(default_factory=Normalization)
    privacy: Privacy = field(default_factory=Privacy)
    origin: str = field(default="", compare=False)
    """Where the rule was written (``file:line``), for messages and ``explain``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a rule needs a name")
        _check(self.scope, get_args(Scope), "scope")
        if min(self.ttl_s, self.stale_while_revalidate_s, self.stale_if_error_s) < 0:
            raise ValueError(f"rule {self.name!r}: ttl and stale windows must not be negative")


# What a request gets when no rule matches: never cached, default normalization, no detectors.
NO_MATCH = Rule(name="no-match", cache=False, origin="<built-in>")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """An ordered set of rules with a version label; the first matching rule decides."""

    version: str
    rules: tuple[Rule, ...]
    sources: tuple[str, ...] = ()

    def match(self, *, route: str, model: str, tenant: str, headers: Headers) -> Rule:
        """The first rule that matches, or the built-in ``no-match`` rule (cache off)."""
        for rule in self.rules:
            if rule.match.matches(route=route, model=model, tenant=tenant, headers=headers):
                return rule
        return NO_MATCH
