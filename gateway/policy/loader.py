"""Policy files -> ``Policy``: YAML, validated against the JSON Schema, errors with file and line.

A policy file has an optional ``version`` label, optional ``defaults`` (settings every rule of
that file starts from) and ``rules``. Settings a file does not give come from ``BASE`` (the same
values as ``policies/default.yaml``: cache on, tenant scope, 1 h, every detector ``no_store``),
so a file that forgets privacy still protects it. A rule's ``normalization`` and
``privacy.detectors`` add to the defaults key by key; ``off`` switches a detector off.

Several files (or a folder's ``*.yaml``, by name; subfolders such as ``examples/`` are never
read) concatenate their rules in order. Beyond the schema, a ``match`` that no request can meet
is an error (``targets``: an unknown route, an unknown model when the served models are given,
header conditions HTTP cannot carry). Any error in any file refuses the whole set:
``PolicyError`` lists every problem as ``file:line: field: message``.
The effective version is the label plus a hash of the rules' meaning (comments do not change it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from gateway.policy.model import DETECTOR_NAMES, Match, Normalization, Policy, Privacy, Rule
from gateway.policy.schema import SCHEMA
from gateway.policy.targets import KnownModels, match_problems
from gateway.policy.yamlpos import Located, describe, field_path, parse

BASE: dict[str, Any] = {
    "cache": True, "scope": "tenant", "ttl_s": 3600.0, "stale_while_revalidate_s": 0.0,
    "stale_if_error_s": 600.0, "normalization": {},
    "detectors": dict.fromkeys(DETECTOR_NAMES, "no_store"),
}
DEFAULT_LABEL = "default-1"
_VALIDATOR = Draft202012Validator(SCHEMA)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)")


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    """One problem in a policy file, located as precisely as the YAML allows."""

    file: str
    line: int | None
    field: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{where}: {self.field}: {prefix}{self.message}"


class PolicyError(Exception):
    """A policy set that cannot be loaded; ``errors`` says where and why."""

    def __init__(self, errors: list[PolicyIssue]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"invalid policy ({len(errors)} error{'s' * (len(errors) != 1)}):\n"
                         f"{lines}")


def parse_duration(value: float | str) -> float:
    """Seconds from ``90``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"1d"``, ``"250ms"``."""
    if isinstance(value, int | float):
        return float(value)
    return sum(float(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(value))


def policy_files(paths: Iterable[Path]) -> list[Path]:
    """The files a list of paths names: folders contribute their ``*.yaml``/``*.yml`` by name.

    Only files directly in a folder count, never its subfolders: ``policies/examples/`` sits
    beside the active ``policies/default.yaml`` without becoming part of it.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(
                (p for p in path.iterdir()
                 if p.suffix in (".yaml", ".yml") and not p.name.startswith(".")
                 and p.is_file()),
                key=lambda p: p.name,
            ))
        else:
            files.append(path)
    return files


def _as_tuple(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def _merge(base: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key in ("cache", "scope"):
        if key in raw:
            out[key] = raw[key]
    for key in ("ttl", "stale_while_revalidate", "stale_if_error"):
        if key in raw:
            out[f"{key}_s"] = parse_duration(raw[key])
    if "normalization" in raw:
        out["normalization"] = {**base["normalization"], **raw["normalization"]}
    detectors = raw.get("privacy", {}).get("detectors")
    if detectors is not None:
        merged = {**base["detectors"], **detectors}
        out["detectors"] = {k: v for k, v in merged.items() if v != "off"}
    return out


def _rule(raw: Mapping[str, Any], settings: Mapping[str, Any], origin: str) -> Rule:
    match = raw.get("match") or {}
    headers = match.get("headers")
    return Rule(
        name=raw["name"],
        match=Match(
            routes=_as_tuple(match.get("routes")),
            models=_as_tuple(match.get("models")),
            tenants=_as_tuple(match.get("tenants")),
            headers=None if headers is None else {k: str(v) for k, v in headers.items()},
        ),
        cache=settings["cache"],
        scope=settings["scope"],
        ttl_s=settings["ttl_s"],
        stale_while_revalidate_s=settings["stale_while_revalidate_s"],
        stale_if_error_s=settings["stale_if_error_s"],
        normalization=Normalization(**settings["normalization"]),
        privacy=Privacy(detectors=settings["detectors"]),
        origin=origin,
    )


@dataclass(slots=True)
class _File:
    label: str | None
    rules: list[tuple[Rule, int, int | None]]  # rule, its index, the line of its name


def _match_issues(name: str, doc: Located, index: int, raw: Mapping[str, Any],
                  models: KnownModels | None) -> list[PolicyIssue]:
    issues = []
    for sub, key, message in match_problems(raw.get("match") or {}, models):
        path = ["rules", index, "match", *sub]
        issues.append(PolicyIssue(name, doc.line(path, key=key), field_path(path), message))
    return issues


Source = tuple[str, str]
"""One policy file as read: its name and its text."""


def read_sources(paths: Sequence[Path]) -> list[Source]:
    """The text of every file ``paths`` name, in load order; ``PolicyError`` when there is
    none, or naming every file that cannot be read."""
    files = policy_files(paths)
    if not files:
        where = ", ".join(str(p) for p in paths) or "(no paths)"
        raise PolicyError([PolicyIssue(where, None, "(files)", "no *.yaml policy files found")])
    sources: list[Source] = []
    issues: list[PolicyIssue] = []
    for path in files:
        try:
            sources.append((str(path), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            issues.append(PolicyIssue(str(path), None, "(file)", f"cannot read: {exc}"))
    if issues:
        raise PolicyError(issues)
    return sources


def _load_file(name: str, text: str, issues: list[PolicyIssue],
               models: KnownModels | None) -> _File | None:
    doc, problems = parse(text)
    if doc is None:
        issues.extend(PolicyIssue(name, line, field, msg) for line, field, msg in problems)
        return None
    found = sorted((p for err in _VALIDATOR.iter_errors(doc.data) for p in describe(err, doc)),
                   key=lambda p: (p[0] or 0, p[1]))
    if found:
        issues.extend(PolicyIssue(name, line, field, msg) for line, field, msg in found)
        return None
    data: dict[str, Any] = doc.data
    base = _merge(BASE, data.get("defaults", {}))
    rules: list[tuple[Rule, int, int | None]] = []
    for index, raw in enumerate(data["rules"]):
        line = doc.line(["rules", index])
        issues.extend(_match_issues(name, doc, index, raw, models))
        try:
            rule = _rule(raw, _merge(base, raw), f"{name}:{line}")
        except ValueError as exc:
            issues.append(PolicyIssue(name, line, f"rules[{index}]", str(exc)))
            continue
        rules.append((rule, index, doc.line(["rules", index, "name"])))
    label = data.get("version")
    return _File(None if label is None else str(label), rules)


def policy_hash(rules: Sequence[Rule]) -> str:
    """8 hex characters over what the rules mean (not how the file spells them)."""
    h = hashlib.sha256()
    for r in rules:
        m, n = r.match, r.normalization
        headers = None if m.headers is None else sorted(m.headers.items())
        h.update(repr((
            r.name, m.routes, m.models, m.tenants, headers, r.cache, r.scope, r.ttl_s,
            r.stale_while_revalidate_s, r.stale_if_error_s, n.unicode_form, n.casefold,
            n.whitespace, n.max_chars, n.on_overflow, n.max_items,
            sorted(r.privacy.detectors.items()),
        )).encode())
    return h.hexdigest()[:8]


def _version(labels: Sequence[str], rules: Sequence[Rule]) -> str:
    label = ",".join(dict.fromkeys(labels))
    return f"{label}+{policy_hash(rules)}" if label else policy_hash(rules)


def load_policy(paths: Sequence[Path], *, models: KnownModels | None = None) -> Policy:
    """Load, validate and combine policy files (or folders of them); ``PolicyError`` if invalid.

    ``models``: the models the gateway serves; a rule naming another one is an error. ``None``
    leaves model names unchecked.
    """
    return load_sources(read_sources(paths), models=models)


def load_sources(sources: Sequence[Source], *, models: KnownModels | None = None) -> Policy:
    """``load_policy`` over texts already read (``read_sources``): the same texts always make
    the same policy, which is how a gateway's workers share one (``policy/share.py``)."""
    issues: list[PolicyIssue] = []
    rules: list[Rule] = []
    labels: list[str] = []
    first_seen: dict[str, str] = {}
    for name, text in sources:
        loaded = _load_file(name, text, issues, models)
        if loaded is None:
            continue
        if loaded.label:
            labels.append(loaded.label)
        for rule, index, line in loaded.rules:
            if rule.name in first_seen:
                issues.append(PolicyIssue(
                    name, line, f"rules[{index}].name",
                    f"duplicate rule name {rule.name!r} (first at {first_seen[rule.name]})"))
            first_seen.setdefault(rule.name, rule.origin)
            rules.append(rule)
    if issues:
        raise PolicyError(issues)
    return Policy(version=_version(labels, rules), rules=tuple(rules),
                  sources=tuple(name for name, _ in sources))


def lint(policy: Policy) -> list[PolicyIssue]:
    """Warnings for a valid policy: no rules at all, or rules after a catch-all (unreachable)."""
    warnings: list[PolicyIssue] = []
    if not policy.rules:
        warnings.append(PolicyIssue(",".join(policy.sources), None, "rules",
                                    "no rules: every request is answered uncached",
                                    severity="warning"))
    catch_all: Rule | None = None
    for rule in policy.rules:
        if catch_all is not None:
            file, _, line = rule.origin.rpartition(":")
            warnings.append(PolicyIssue(
                file or rule.origin, int(line) if line.isdigit() else None, rule.name,
                f"unreachable: rule {catch_all.name!r} ({catch_all.origin}) matches every request",
                severity="warning"))
        elif rule.match.matches_everything:
            catch_all = rule
    return warnings


def default_policy() -> Policy:
    """The built-in policy (what ``policies/default.yaml`` says), used without ``--policies``."""
    rule = Rule(
        name="default",
        cache=BASE["cache"], scope=BASE["scope"], ttl_s=BASE["ttl_s"],
        stale_while_revalidate_s=BASE["stale_while_revalidate_s"],
        stale_if_error_s=BASE["stale_if_error_s"],
        normalization=Normalization(**BASE["normalization"]),
        privacy=Privacy(detectors=BASE["detectors"]),
        origin="<built-in default>",
    )
    return Policy(version=_version([DEFAULT_LABEL], [rule]), rules=(rule,),
                  sources=("<built-in default>",))
