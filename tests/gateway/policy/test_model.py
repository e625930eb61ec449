"""Policy values: rule matching (order, globs, headers), validation, the built-in no-match rule."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policy import NO_MATCH, Match, Policy, Privacy, Rule

REQ: dict[str, Any] = {
    "route": "/v1/embeddings", "model": "minilm", "tenant": "acme", "headers": {},
}


def policy(*rules: Rule) -> Policy:
    return Policy(version="t", rules=rules)


def test_first_matching_rule_wins() -> None:
    p = policy(
        Rule(name="debug", match=Match(headers={"X-Debug": "1"}), cache=False),
        Rule(name="embeddings", match=Match(routes=("/v1/embeddings",))),
        Rule(name="all"),
    )
    assert p.match(**REQ).name == "embeddings"
    assert p.match(**{**REQ, "headers": {"x-debug": "1"}}).name == "debug"
    assert p.match(**{**REQ, "route": "/v1/rank"}).name == "all"


def test_no_rule_matching_gives_the_built_in_no_cache_rule() -> None:
    p = policy(Rule(name="only-rank", match=Match(routes=("/v1/rank",))))
    rule = p.match(**REQ)
    assert rule is NO_MATCH
    assert rule.name == "no-match"
    assert rule.cache is False
    assert policy().match(**REQ) is NO_MATCH


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        (Match(), True),
        (Match(routes=("/v1/*",)), True),
        (Match(routes=("/v2/*",)), False),
        (Match(models=("mini*",), tenants=("ac?e",)), True),
        (Match(models=("minilm",), tenants=("beta", "acme")), True),
        (Match(tenants=("[ab]*",)), True),
        (Match(tenants=("b*",)), False),
        (Match(routes=("/v1/embeddings",), models=("other",)), False),  # every condition holds
    ],
)
def test_match_globs(match: Match, expected: bool) -> None:
    assert match.matches(**REQ) is expected


def test_header_match_exact_glob_and_case_of_names() -> None:
    m = Match(headers={"X-Env": "prod-*", "x-debug": "1"})
    assert m.headers == {"x-env": "prod-*", "x-debug": "1"}
    assert m.matches(**{**REQ, "headers": {"x-env": "prod-eu", "x-debug": "1"}})
    assert m.matches(**{**REQ, "headers": {"X-Env": "prod-eu", "X-Debug": "1"}})  # plain dicts too
    assert not m.matches(**{**REQ, "headers": {"x-env": "staging", "x-debug": "1"}})
    assert not m.matches(**{**REQ, "headers": {"x-env": "prod-eu"}})  # missing header


def test_globs_are_case_sensitive_and_anchored() -> None:
    m = Match(models=("mini",))
    assert not m.matches(**REQ)
    assert not Match(tenants=("ACME",)).matches(**REQ)


def test_matches_everything() -> None:
    assert Match().matches_everything
    assert Match(routes=("*",), tenants=("*",)).matches_everything
    assert not Match(routes=("/v1/*",)).matches_everything
    assert not Match(headers={"x": "*"}).matches_everything


def test_rules_validate_themselves() -> None:
    with pytest.raises(ValueError):
        Rule(name="")
    with pytest.raises(ValueError, match="scope"):
        Rule(name="x", scope="global")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        Rule(name="x", ttl_s=-1)
    with pytest.raises(ValueError, match="detector"):
        Privacy(detectors={"passport": "reject"})
    with pytest.raises(ValueError, match="action"):
        Privacy(detectors={"email": "drop"})  # type: ignore[dict-item]


def test_values_are_immutable_and_hashable() -> None:
    rule = Rule(name="x", match=Match(headers={"a": "b"}),
                privacy=Privacy(detectors={"email": "redact"}))
    with pytest.raises(AttributeError):
        rule.name = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        rule.privacy.detectors["email"] = "reject"  # type: ignore[index]
    assert hash(rule) == hash(Rule(name="x", match=Match(headers={"a": "b"}),
                                   privacy=Privacy(detectors={"email": "redact"})))
    assert rule == Rule(name="x", match=Match(headers={"A": "b"}),
                        privacy=Privacy(detectors={"email": "redact"}), origin="elsewhere")
