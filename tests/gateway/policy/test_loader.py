"""Policy files: schema validation with file/line/field errors, merging, folders, versions."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.policy import PolicyError, default_policy, load_policy
from gateway.policy.loader import lint, parse_duration
from gateway.policy.schema import SCHEMA, dumps

REPO = Path(__file__).resolve().parents[3]
SHIPPED = [REPO / "policies" / "default.yaml", REPO / "policies" / "examples" / "strict.yaml"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def errors(paths: list[Path]) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(paths)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_load_and_validate_against_the_published_schema(path: Path) -> None:
    import yaml

    Draft202012Validator.check_schema(SCHEMA)
    data = yaml.load(path.read_text(), Loader=yaml.BaseLoader)  # all scalars as strings
    assert data["rules"]
    policy = load_policy([path])
    assert policy.rules
    assert lint(policy) == []


def test_published_schema_file_is_the_schema_the_loader_uses() -> None:
    assert (REPO / "policies" / "schema.json").read_text() == dumps()
    assert json.loads(dumps()) == SCHEMA


def test_default_yaml_is_the_built_in_default() -> None:
    shipped = load_policy([REPO / "policies" / "default.yaml"])
    builtin = default_policy()
    assert shipped.rules == builtin.rules
    assert shipped.version == builtin.version
    rule = builtin.rules[0]
    assert rule.cache and rule.scope == "tenant" and rule.ttl_s == 3600
    assert dict(rule.privacy.detectors) == dict.fromkeys(
        ["email", "phone", "card", "us_ssn", "iban", "ip", "secret"], "no_store")


def test_strict_example_decides_as_documented() -> None:
    policy = load_policy([REPO / "policies" / "examples" / "strict.yaml"])
    args: dict[str, Any] = {"model": "minilm", "tenant": "acme", "headers": {}}
    assert policy.match(route="/v1/embeddings", **args).scope == "shared"
    assert policy.match(route="/v1/rank", **{**args, "tenant": "bank-eu"}).cache is False
    assert policy.match(route="/v1/rank", **{**args, "headers": {"x-debug": "1"}}).cache is False
    assert policy.match(route="/v1/classify", **args).normalization.casefold is True
    default = policy.match(route="/v1/rank", **args)
    assert default.name == "default"
    assert default.privacy.detectors["card"] == "reject"
    assert default.privacy.detectors["email"] == "redact"


def test_bad_field_is_reported_with_file_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", """
        version: 1
        rules:
          - name: ok
          - name: typo
            match:
              routes: [/v1/embeddings]
            ttl: 5 minutes
            scope: global
            cache: maybe
            privacy:
              detectors:
                emial: no_store
                card: shred
    """)
    found = errors([path])
    assert found == [
        f"{path}:7: rules[1].ttl: '5 minutes' is not valid: expected a duration: seconds as a "
        "number, or a string such as 30s, 5m, 1h, 1d, 1h30m",
        f"{path}:8: rules[1].scope: must be one of tenant, shared, not 'global'",
        f"{path}:9: rules[1].cache: must be true or false, not a string ('maybe')",
        f"{path}:12: rules[1].privacy.detectors.emial: unknown field (did you mean 'email'?); "
        "allowed: email, phone, card, us_ssn, iban, ip, secret",
        f"{path}:13: rules[1].privacy.detectors.card: must be one of no_store, redact, reject, off,"
        " not 'shred'",
    ]


def test_unknown_and_missing_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", """
        rules:
          - match: {routes: [/v1/rank]}
            tll: 1h
    """)
    assert errors([path]) == [
        f"{path}:2: rules[0]: missing required field 'name'",
        f"{path}:3: rules[0].tll: unknown field (did you mean 'ttl'?); allowed: name, "
        "description, match, cache, scope, ttl, stale_while_revalidate, stale_if_error, "
        "normalization, privacy",
    ]


def test_yaml_syntax_errors_and_duplicate_keys_have_lines(tmp_path: Path) -> None:
    broken = write(tmp_path, "broken.yaml", "rules:\n  - name: a\n    ttl: [1h\n")
    [message] = errors([broken])
    assert message.startswith(f"{broken}:") and "YAML syntax error" in message
    dup = write(tmp_path, "dup.yaml", "rules:\n  - name: a\n    ttl: 1h\n    ttl: 2h\n")
    assert errors([dup]) == [f"{dup}:4: rules[0].ttl: duplicate key (first at line 3)"]
    empty = write(tmp_path, "empty.yaml", "# nothing\n")
    assert errors([empty]) == [f"{empty}:1: (document): the file is empty"]
    control = write(tmp_path, "control.yaml", "rules:\n  - name: a\x07\n")
    assert errors([control]) == [f"{control}:2: (document): character U+0007 is not allowed in a "
                                 "YAML file: remove it"]


def test_missing_file_and_empty_folder(tmp_path: Path) -> None:
    [missing] = errors([tmp_path / "nope.yaml"])
    assert "nope.yaml" in missing and "cannot read" in missing
    [empty] = errors([tmp_path])
    assert "no *.yaml policy files" in empty


def test_defaults_merge_into_rules_key_by_key(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", """
        defaults:
          ttl: 10m
          normalization: {casefold: true, max_chars: 100}
          privacy: {detectors: {email: redact}}
        rules:
          - name: a
            ttl: 90
            normalization: {max_chars: 50}
            privacy: {detectors: {card: reject, ip: off}}
          - name: b
    """)
    a, b = load_policy([path]).rules
    assert a.ttl_s == 90 and b.ttl_s == 600
    assert (a.normalization.casefold, a.normalization.max_chars) == (True, 50)
    assert (b.normalization.casefold, b.normalization.max_chars) == (True, 100)
    assert a.privacy.detectors["email"] == "redact"
    assert a.privacy.detectors["card"] == "reject"
    assert "ip" not in a.privacy.detectors
    assert b.privacy.detectors["ip"] == "no_store"  # the built-in base: every detector on
    assert a.origin == f"{path}:6"


def test_durations() -> None:
    assert parse_duration(45) == 45.0
    assert parse_duration("30s") == 30
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1d") == 86400
    assert parse_duration("250ms") == 0.25


def test_folder_loads_yaml_files_in_name_order_and_concatenates(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    write(folder, "20-rest.yaml", "version: b\nrules:\n  - name: rest\n")
    write(folder, "10-first.yaml", "version: a\nrules:\n  - name: first\n"
                                   "    match: {tenants: [acme]}\n")
    write(folder, "notes.txt", "not a policy")
    policy = load_policy([folder])
    assert [r.name for r in policy.rules] == ["first", "rest"]
    assert policy.version.startswith("a,b+")
    assert policy.sources == (str(folder / "10-first.yaml"), str(folder / "20-rest.yaml"))


def test_one_invalid_file_refuses_the_whole_set(tmp_path: Path) -> None:
    good = write(tmp_path, "a.yaml", "rules:\n  - name: a\n")
    bad = write(tmp_path, "b.yaml", "rules:\n  - name: b\n    scope: everyone\n")
    [message] = errors([good, bad])
    assert message.startswith(f"{bad}:3: rules[0].scope:")


def test_duplicate_rule_names_across_files(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "rules:\n  - name: same\n")
    b = write(tmp_path, "b.yaml", "rules:\n  - name: other\n  - name: same\n")
    assert errors([a, b]) == [
        f"{b}:3: rules[1].name: duplicate rule name 'same' (first at {a}:2)"]


def test_version_is_label_plus_a_hash_of_meaning_not_of_comments(tmp_path: Path) -> None:
    one = write(tmp_path, "one.yaml", "version: 2026-12-01.1\nrules:\n  - name: a\n    ttl: 1h\n")
    two = write(tmp_path, "two.yaml", "# a comment\nversion: 2026-12-01.1\nrules:\n"
                                      "  - name: a   # same rule\n    ttl: 3600\n")
    three = write(tmp_path, "three.yaml", "version: 2026-12-01.1\nrules:\n  - name: a\n"
                                          "    ttl: 2h\n")
    v1, v2, v3 = (load_policy([p]).version for p in (one, two, three))
    assert v1 == v2
    assert v1 != v3
    assert v1.startswith("2026-12-01.1+") and len(v1) == len("2026-12-01.1+") + 8
    unlabelled = write(tmp_path, "u.yaml", "rules:\n  - name: a\n")
    assert "+" not in load_policy([unlabelled]).version


def test_lint_warns_about_rules_after_a_catch_all(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "rules:\n  - name: all\n  - name: never\n"
                                     "    match: {routes: [/v1/rank]}\n")
    [warning] = lint(load_policy([path]))
    assert str(warning) == (f"{path}:3: never: warning: unreachable: rule 'all' ({path}:2) "
                            "matches every request")


def test_policy_error_message_is_readable(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "rules:\n  - name: a\n    ttl: soon\n")
    with pytest.raises(PolicyError) as info:
        load_policy([path])
    text = str(info.value)
    assert text.splitlines()[0] == "invalid policy (1 error):"
    assert f"{path}:3: rules[0].ttl:" in text


def test_lint_warns_about_a_policy_without_rules(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "rules: []\n")
    policy = load_policy([path])
    assert policy.match(route="/v1/embeddings", model="m", tenant="t", headers={}).cache is False
    [warning] = lint(policy)
    assert "no rules" in str(warning)
