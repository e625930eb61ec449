"""evaluate(): rule, normalization and privacy actions per item; explain() never shows text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import PolicyRejected, ValidationFailed
from gateway.policy import (
    Decision,
    Match,
    Normalization,
    Policy,
    Privacy,
    Rule,
    default_policy,
    evaluate,
    evaluate_groups,
)
from gateway.policy.evaluate import decide

ARGS: dict[str, Any] = {
    "route": "/v1/embeddings", "model": "minilm", "tenant": "acme", "headers": {},
}
EMAIL = "contact me at jane.doe@example.com please"


def one_rule(**kwargs: object) -> Policy:
    return Policy(version="v1", rules=(Rule(name="r", **kwargs),))  # type: ignore[arg-type]


def test_default_policy_caches_clean_text_per_tenant() -> None:
    d = evaluate(default_policy(), texts=["  Hello   world "], **ARGS)
    assert d.rule.name == "default"
    assert d.cache is True
    assert d.scope == "acme"
    assert [(i.text, i.store, i.detectors) for i in d.items] == [("Hello world", True, ())]
    assert d.trail == f"default@{default_policy().version}"


def test_list_input_with_one_pii_item_marks_only_that_item() -> None:
    texts = ["first clean text", EMAIL, "call 555-123-4567", "last clean text"]
    d = evaluate(default_policy(), texts=texts, **ARGS)
    assert [i.store for i in d.items] == [True, False, False, True]
    assert [i.detectors for i in d.items] == [(), ("email",), ("phone",), ()]
    assert d.not_stored == (1, 2)
    assert d.items[1].text == EMAIL  # no_store answers the text as it is


def test_redact_masks_before_the_backend_and_the_key_and_still_stores() -> None:
    p = one_rule(privacy=Privacy(detectors={"email": "redact", "phone": "no_store"}))
    d = evaluate(p, texts=[EMAIL, EMAIL + " or 555-123-4567"], **ARGS)
    assert d.items[0].text == "contact me at [EMAIL] please"
    assert d.items[0].store is True
    assert d.items[1].text == "contact me at [EMAIL] please or 555-123-4567"
    assert d.items[1].store is False  # the phone's no_store still applies
    assert d.items[1].detectors == ("email", "phone")


def test_reject_raises_a_422_naming_detector_field_and_rule_never_the_text() -> None:
    p = one_rule(privacy=Privacy(detectors={"card": "reject", "email": "no_store"}))
    with pytest.raises(PolicyRejected) as info:
        evaluate(p, texts=["fine", "pay 4111 1111 1111 1111"], **ARGS)
    err = info.value
    assert (err.status, err.type, err.detector, err.rule, err.field) == (
        422, "policy_rejected", "card", "r", "input[1]")
    assert "4111" not in err.message
    # A single text is named by the field alone.
    with pytest.raises(PolicyRejected) as single:
        evaluate(p, texts=["pay 4111 1111 1111 1111"], field="query", **ARGS)
    assert single.value.field == "query"


def test_detectors_see_normalized_text() -> None:
    p = one_rule(normalization=Normalization(unicode_form="NFKC"),
                 privacy=Privacy(detectors={"card": "no_store"}))
    full_width = "\uff14\uff11\uff11\uff11 1111 1111 1111"  # "4111" in full-width digits
    d = evaluate(p, texts=[full_width], **ARGS)
    assert d.items[0].text == "4111 1111 1111 1111"
    assert d.items[0].store is False


def test_casefold_then_detect() -> None:
    p = one_rule(normalization=Normalization(casefold=True),
                 privacy=Privacy(detectors={"email": "redact", "secret": "redact"}))
    d = evaluate(p, texts=["Mail JANE@EXAMPLE.COM key AKIAIOSFODNN7EXAMPLE"], **ARGS)
    assert d.items[0].text == "mail [EMAIL] key [SECRET]"


def test_too_many_items_is_a_422_naming_the_field() -> None:
    p = one_rule(normalization=Normalization(max_items=2))
    with pytest.raises(ValidationFailed) as info:
        evaluate(p, texts=["a", "b", "c"], field="documents", **ARGS)
    assert info.value.field == "documents"
    assert info.value.status == 422
    # The message says what to fix: the limit and how many were sent.
    assert info.value.reason == "at most 2 items allowed, got 3"


def test_max_chars_truncate_or_reject() -> None:
    truncate = one_rule(normalization=Normalization(max_chars=5))
    assert evaluate(truncate, texts=["abcdefgh"], **ARGS).items[0].text == "abcde"
    reject = one_rule(normalization=Normalization(max_chars=5, on_overflow="reject"))
    with pytest.raises(ValidationFailed) as info:
        evaluate(reject, texts=["ok", "abcdefgh"], **ARGS)
    assert info.value.field == "input[1]"


def test_a_value_cut_by_truncation_still_counts() -> None:
    p = one_rule(normalization=Normalization(max_chars=20),
                 privacy=Privacy(detectors={"card": "no_store", "email": "no_store"}))
    cut = evaluate(p, texts=["my card: 4111 1111 1111 1111"], **ARGS).items[0]
    assert cut.text == "my card: 4111 1111 1"
    assert cut.store is False
    past = evaluate(p, texts=["x" * 30 + " a@b.example.com"], **ARGS).items[0]
    assert past.store is True  # wholly past the cut: never sent anywhere


def test_redaction_of_a_cut_value_masks_what_is_left() -> None:
    p = one_rule(normalization=Normalization(max_chars=20),
                 privacy=Privacy(detectors={"card": "redact"}))
    assert evaluate(p, texts=["my card: 4111 1111 1111 1111"], **ARGS).items[0].text == (
        "my card: [CARD]")


def test_shared_scope_and_cache_off() -> None:
    shared = one_rule(scope="shared")
    assert evaluate(shared, texts=["x"], **ARGS).scope == "shared"
    off = one_rule(cache=False)
    d = evaluate(off, texts=["x", EMAIL], **ARGS)
    assert d.cache is False
    assert [i.store for i in d.items] == [False, False]


def test_unmatched_request_is_not_cached() -> None:
    p = Policy(version="v", rules=(Rule(name="rank", match=Match(routes=("/v1/rank",))),))
    d = evaluate(p, texts=["hello"], **ARGS)
    assert d.rule.name == "no-match"
    assert d.cache is False
    assert d.items[0].store is False


def test_explain_is_json_and_holds_no_text() -> None:
    d = evaluate(default_policy(), texts=["clean", EMAIL, "card 4111 1111 1111 1111"], **ARGS)
    info = d.explain()
    json.dumps(info)
    assert info["rule"] == "default"
    assert info["cacheable"] is True
    assert info["scope"] == "tenant"
    assert info["scope_key"] == "acme"
    assert info["ttl_s"] == 3600.0
    assert info["stale_if_error_s"] == 600.0
    assert info["detectors"] == ["email", "card"]
    assert info["actions"] == {"email": "no_store", "card": "no_store"}
    assert info["not_stored"] == [1, 2]
    assert info["normalization"] == Normalization().fingerprint
    dumped = json.dumps(info)
    assert "jane" not in dumped and "4111" not in dumped


def test_nothing_cacheable_when_every_item_holds_pii() -> None:
    d = evaluate(default_policy(), texts=[EMAIL], **ARGS)
    assert d.explain()["cacheable"] is False


def test_evaluate_groups_concatenates_fields() -> None:
    d = evaluate_groups(default_policy(), route="/v1/rank", model="m", tenant="t", headers={},
                        groups=[("query", ["q"]), ("documents", ["a", EMAIL])])
    assert isinstance(d, Decision)
    assert [i.store for i in d.items] == [True, True, False]
    p = one_rule(normalization=Normalization(max_items=2))
    with pytest.raises(ValidationFailed) as info:
        evaluate_groups(p, route="/v1/rank", model="m", tenant="t", headers={},
                        groups=[("query", ["q"]), ("documents", ["a", "b", "c"])])
    assert info.value.field == "documents"


# Each irregularity on its own: the ASCII fast path must notice every one of them (a text with
# all of them at once would hide a missed one).
@pytest.mark.parametrize(("raw", "want"), [
    (" leading space", "leading space"),
    ("trailing space ", "trailing space"),
    ("two  spaces", "two spaces"),
    ("a\ttab", "a tab"),
    ("a\nnewline", "a newline"),
    ("no\u00a0\u00a0break", "no break"),  # not ASCII: the full Unicode path
])
def test_each_whitespace_irregularity_is_collapsed_on_its_own(raw: str, want: str) -> None:
    d = evaluate(default_policy(), texts=[raw], **ARGS)
    assert d.items[0].text == want


def test_casefold_of_non_ascii_text_with_detectors_is_full_casefolding() -> None:
    p = one_rule(normalization=Normalization(casefold=True),
                 privacy=Privacy(detectors={"email": "redact"}))
    assert evaluate(p, texts=["STRASSE Straße"], **ARGS).items[0].text == "strasse strasse"


def test_a_cache_off_rule_never_stores_even_a_redacted_item() -> None:
    p = one_rule(cache=False, privacy=Privacy(detectors={"email": "redact"}))
    item = evaluate(p, texts=[EMAIL], **ARGS).items[0]
    assert item.text == "contact me at [EMAIL] please"
    assert item.store is False


def test_a_value_starting_exactly_at_the_cut_is_never_acted_on() -> None:
    p = one_rule(normalization=Normalization(max_chars=5),
                 privacy=Privacy(detectors={"email": "reject"}))
    d = evaluate(p, texts=["abcd,jane.doe@example.com"], **ARGS)
    assert (d.items[0].text, d.items[0].store, d.items[0].detectors) == ("abcd,", True, ())


def test_evaluate_groups_matches_rules_on_route_model_tenant_and_headers() -> None:
    p = Policy(version="v", rules=(
        Rule(name="route", match=Match(routes=("/v1/classify",))),
        Rule(name="model", match=Match(models=("other",))),
        Rule(name="tenant", match=Match(tenants=("bank-*",))),
        Rule(name="header", match=Match(headers={"x-team": "ads"})),
        Rule(name="default"),
    ))
    groups = [("input", ["x"])]
    base: dict[str, Any] = {"route": "/v1/embeddings", "model": "minilm", "tenant": "acme",
                            "headers": {}}
    for change, rule in [({}, "default"), ({"route": "/v1/classify"}, "route"),
                         ({"model": "other"}, "model"), ({"tenant": "bank-1"}, "tenant"),
                         ({"headers": {"x-team": "ads"}}, "header")]:
        d = evaluate_groups(p, **{**base, **change}, groups=groups)
        assert d.rule.name == rule, change


def test_decide_names_the_input_field_unless_told_otherwise() -> None:
    rule = Rule(name="r", normalization=Normalization(max_items=1))
    with pytest.raises(ValidationFailed) as info:
        decide(rule, "v", tenant="t", texts=["a", "b"])
    assert (info.value.field, info.value.reason) == ("input", "at most 1 items allowed, got 2")


def test_evaluate_groups_scopes_by_the_rule() -> None:
    """/v1/rank, /v1/classify and OIP go through evaluate_groups: its scope is the cache key's
    scope (a shared rule pools tenants, any other keeps them apart)."""
    args: dict[str, Any] = {"route": "/v1/rank", "model": "m", "headers": {},
                            "groups": [("query", ["q"]), ("documents", ["a"])]}
    shared = one_rule(scope="shared")
    assert evaluate_groups(shared, tenant="acme", **args).scope == "shared"
    assert evaluate_groups(one_rule(), tenant="acme", **args).scope == "acme"
    assert evaluate_groups(shared, tenant="acme", **args).policy_version == shared.version


def test_a_single_fields_errors_name_that_field() -> None:
    """One group (an OIP input tensor, /v1/embeddings' ``input``) takes the short path: its
    errors still name the request's own field."""
    p = one_rule(normalization=Normalization(max_items=2))
    with pytest.raises(ValidationFailed) as info:
        evaluate_groups(p, route="/v2/models/m/infer", model="m", tenant="t", headers={},
                        groups=[("text_input", ["a", "b", "c"])])
    assert info.value.field == "text_input"
