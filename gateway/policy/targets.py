"""What a rule's ``match`` can name, and the conditions in it that no request can ever meet.

The gateway decides a policy for each request to one of its cached routes, named by the route
pattern (``KnownModels.routes``, which the gateway fills from its route registry,
gateway/adapters/registry.py: an OIP call to ``/v2/models/minilm/infer`` is matched as
``/v2/models/{name}/infer``); for the model after alias resolution (a rule names ``minilm``, never
the alias ``all-MiniLM-L6-v2``); and on the request headers, lowercased, except those the gateway
keeps out of policies (``HIDDEN_HEADERS``: credentials and body framing; tenants are matched with
``tenants:``). A route, model or header condition that can never hold is nearly always a typo
that silently switches a rule off, so the loader refuses it, with file and line, as it refuses a
schema error. Pure: values in, problems out.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

HIDDEN_HEADERS: frozenset[str] = frozenset(
    {"authorization", "cookie", "content-length", "content-type"}
)
"""Request headers the gateway never shows to policy matching."""
OIP_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 field-name
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # HTTP forbids these in field values

Problem = tuple[tuple[str | int, ...], bool, str]
"""(path under the rule's ``match``, whether the problem is the key at that path, message)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownModels:
    """What rules may name: the cached routes (as rules see them: the gateway's route registry),
    the model names (as the gateway serves them) and the aliases it resolves."""

    routes: tuple[str, ...]
    names: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.routes or not all(self.routes):
            raise ValueError("routes: at least one cached route is required")
        if not self.names or not all(self.names):
            raise ValueError("models: at least one non-empty model name is required")

    def resolve(self, name: str) -> str:
        """The served name for ``name`` (itself when it is not an alias)."""
        return self.aliases.get(name, name)


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` uses ``fnmatch`` syntax (as ``Match`` reads it)."""
    return any(c in pattern for c in "*?[")


def _suggest(value: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _names(value: str | Sequence[str]) -> list[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, str):
        return [((), value)]
    return [((i,), v) for i, v in enumerate(value)]


def _route_problem(route: str, routes: Sequence[str]) -> str | None:
    listed = ", ".join(routes)
    if is_glob(route):
        if any(fnmatchcase(r, route) for r in routes):
            return None
        return f"{route!r} matches none of the cached routes ({listed})"
    if route in routes:
        return None
    if OIP_INFER.match(route):
        return (f"unknown route {route!r}: rules see every OIP inference call as "
                "'/v2/models/{name}/infer'; narrow it to a model with 'models:'")
    return f"unknown route {route!r}{_suggest(route, routes)}; the cached routes: {listed}"


def _model_problem(model: str, known: KnownModels) -> str | None:
    listed = ", ".join(known.names)
    if is_glob(model):
        if any(fnmatchcase(m, model) for m in known.names):
            return None
        return f"{model!r} matches none of the known models ({listed})"
    if model in known.names:
        return None
    if model in known.aliases:
        target = known.aliases[model]
        return (f"{model!r} is an alias of {target!r}: the gateway resolves aliases before "
                f"rules match, so write {target!r}")
    return f"unknown model {model!r}{_suggest(model, known.names)}; known models: {listed}"


def _header_problems(headers: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    first: dict[str, str] = {}
    for name, value in headers.items():
        key = str(name)
        lowered = key.lower()
        if not _TOKEN.match(key):
            problems.append(((key,), True, f"{key!r} is not a valid header name (letters, "
                             "digits and !#$%&'*+-.^_`|~ only, no spaces or colons)"))
        elif lowered in HIDDEN_HEADERS:
            hint = "; match tenants with 'tenants:'" if lowered == "authorization" else ""
            problems.append(((key,), True, f"header {key!r} is never shown to policies (the "
                             f"gateway keeps credentials and body framing out of them){hint}"))
        elif lowered in first:
            problems.append(((key,), True, f"header {key!r} is already matched as "
                             f"{first[lowered]!r} (header names ignore case)"))
        first.setdefault(lowered, key)
        if isinstance(value, str):
            if _CONTROL.search(value):
                problems.append(((key,), False, "value holds a control character, which no "
                                 "header value can carry"))
            elif value != value.strip(" \t"):
                problems.append(((key,), False, f"value {value!r} starts or ends with "
                                 "whitespace, which HTTP strips from header values"))
    return problems


def match_problems(match: Mapping[str, Any], models: KnownModels | None) -> list[Problem]:
    """What in a (schema-valid) ``match`` mapping no request can satisfy.

    ``models=None`` leaves routes and model names unchecked (what the gateway serves is not
    known here).
    """
    problems: list[Problem] = []
    if models is not None:
        for sub, route in _names(match.get("routes") or ()):
            message = _route_problem(route, models.routes)
            if message:
                problems.append((("routes", *sub), False, message))
        for sub, model in _names(match.get("models") or ()):
            message = _model_problem(model, models)
            if message:
                problems.append((("models", *sub), False, message))
    headers = match.get("headers")
    if headers:
        problems.extend((("headers", *path), key, message)
                        for path, key, message in _header_problems(headers))
    return problems
