"""YAML with positions: parse once, keep the node tree, and turn a JSON path into a line number.

Used to report policy (and tenants) file problems as ``file:line: field: message``. Also catches
what PyYAML silently accepts but a person almost never means: duplicate keys in a mapping.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from jsonschema import ValidationError

Problem = tuple[int | None, str, str]
"""(1-based line or None, field path such as ``rules[2].ttl``, message)."""
PathPart = str | int


def field_path(path: Sequence[PathPart]) -> str:
    """``["rules", 2, "ttl"]`` -> ``rules[2].ttl``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


@dataclass(slots=True)
class Located:
    """A parsed YAML document and its node tree."""

    data: Any
    root: yaml.Node

    def nodes(self, path: Sequence[PathPart]) -> tuple[yaml.Node | None, yaml.Node | None]:
        """The value node at ``path`` and, inside a mapping, its key node."""
        node: yaml.Node | None = self.root
        key: yaml.Node | None = None
        for part in path:
            if isinstance(node, yaml.MappingNode):
                hit = [(k, v) for k, v in node.value if str(k.value) == str(part)]
                if not hit:
                    return node, None
                key, node = hit[-1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return node, None
                key, node = None, node.value[part]
            else:
                return node, key
        return node, key

    def line(self, path: Sequence[PathPart], *, key: bool = False) -> int | None:
        """1-based line of the value at ``path`` (or of its key, with ``key=True``)."""
        node, key_node = self.nodes(path)
        target = key_node if key and key_node is not None else node
        return None if target is None else target.start_mark.line + 1


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars, as editors read the file: dates stay strings
    (``version: 2026-12-01`` is a label) and only true/false are booleans (``ip: off`` is the
    word ``off``, and a tenant called ``no`` is not ``false``)."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers
            if r[0] not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:bool")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _duplicates(node: yaml.Node, path: list[PathPart], seen: set[int]) -> list[Problem]:
    if id(node) in seen:  # aliases point at shared nodes; visit each once
        return []
    seen.add(id(node))
    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value)
            line = k.start_mark.line + 1
            if name in first and name != "<<":
                problems.append((line, field_path([*path, name]),
                                 f"duplicate key (first at line {first[name]})"))
            first.setdefault(name, line)
            problems.extend(_duplicates(v, [*path, name], seen))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems.extend(_duplicates(item, [*path, i], seen))
    return problems


def parse(text: str, loader: type[yaml.SafeLoader] = Yaml12Loader) -> tuple[
    Located | None, list[Problem]
]:
    """Parse one YAML document; problems for syntax errors, duplicate keys or an empty file."""
    try:
        ldr = loader(text)  # the reader refuses control characters anywhere in the text here
    except yaml.reader.ReaderError as exc:
        at = text.count("\n", 0, exc.position) + 1
        return None, [(at, "(document)", f"character U+{exc.character:04X} is not allowed in a "
                       "YAML file: remove it")]
    try:
        root = ldr.get_single_node()
        if root is None:
            return None, [(1, "(document)", "the file is empty")]
        problems = _duplicates(root, [], set())
        if problems:
            return None, problems
        return Located(ldr.construct_document(root), root), []
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        return None, [(line, "(document)", f"YAML syntax error: {what}")]
    except yaml.YAMLError as exc:
        return None, [(None, "(document)", f"YAML error: {exc}")]
    finally:
        ldr.dispose()


_TYPE_WORDS = {"string": "a string", "number": "a number", "integer": "an integer",
               "boolean": "true or false", "array": "a list", "object": "a mapping",
               "null": "empty"}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    for word, types in (("a number", (int, float)), ("a string", (str,)), ("a list", (list,)),
                        ("a mapping", (dict,))):
        if isinstance(value, types):
            return f"{word} ({value!r})" if word in ("a number", "a string") else word
    return "empty" if value is None else type(value).__name__


def _suggest(word: object, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe(err: ValidationError, doc: Located) -> list[Problem]:
    """A schema violation as problems a person can act on, each with its line."""
    path: list[PathPart] = list(err.absolute_path)
    # jsonschema types these loosely (Unset sentinels); this schema always sets them.
    schema: Any = err.schema
    expected: Any = err.validator_value
    instance: Any = err.instance
    if err.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = [str(k) for k in schema.get("properties", {})]
        return [
            (doc.line([*path, k], key=True), field_path([*path, k]),
             f"unknown field{_suggest(k, allowed)}; allowed: {', '.join(allowed)}")
            for k in instance if k not in allowed
        ]
    if err.validator == "required" and isinstance(instance, dict):
        return [(doc.line(path), field_path(path), f"missing required field {r!r}")
                for r in expected if r not in instance]
    if err.validator == "enum":
        choices = [str(c) for c in expected]
        message = (f"must be one of {', '.join(choices)}, not {instance!r}"
                   f"{_suggest(instance, choices)}")
    elif err.validator == "type":
        types = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(_TYPE_WORDS.get(str(t), str(t)) for t in types)
        message = f"must be {wanted}, not {_kind(instance)}"
    elif err.validator == "pattern":
        message = f"{instance!r} is not valid: expected {schema.get('description', '')}"
    else:
        message = err.message
    return [(doc.line(path), field_path(path), message)]
