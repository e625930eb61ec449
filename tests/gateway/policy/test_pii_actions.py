"""Every detector's action is applied, whichever detector it is and whatever else fired.

One value per detector; each test runs once per detector, so an evaluator that looked only at
the first detector (or the first finding, or the first item) fails for the other six.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import PolicyRejected
from gateway.policy import Policy, Privacy, Rule, evaluate, evaluate_groups
from gateway.policy.model import DETECTOR_NAMES
from gateway.policy.pii import LABELS

ARGS: dict[str, Any] = {
    "route": "/v1/embeddings", "model": "minilm", "tenant": "acme", "headers": {},
}
VALUES = {
    "email": "jane.doe@example.com",
    "phone": "+44 20 7946 0958",
    "card": "4111 1111 1111 1111",
    "us_ssn": "123-45-6789",
    "iban": "de89 3704 0044 0532 0130 00",
    "ip": "10.0.0.1",
    "secret": "akiaiosfodnn7example",
}
EVERYTHING = " ; ".join(f"{name} {value}" for name, value in VALUES.items())

detectors = pytest.mark.parametrize("name", DETECTOR_NAMES)


def policy(actions: dict[str, str]) -> Policy:
    rule = Rule(name="r", privacy=Privacy(detectors=actions))  # type: ignore[arg-type]
    return Policy(version="v1", rules=(rule,))


def every(action: str, **others: str) -> dict[str, str]:
    return {name: others.get(name, action) for name in DETECTOR_NAMES}


def test_the_values_are_each_found_by_their_own_detector_only() -> None:
    d = evaluate(policy(every("no_store")), texts=list(VALUES.values()), **ARGS)
    assert [item.detectors for item in d.items] == [(name,) for name in VALUES]
    everything = evaluate(policy(every("no_store")), texts=[EVERYTHING], **ARGS)
    assert everything.items[0].detectors == DETECTOR_NAMES


@detectors
def test_no_store_of_any_one_detector_keeps_the_item_out(name: str) -> None:
    d = evaluate(policy(every("redact", **{name: "no_store"})), texts=[EVERYTHING], **ARGS)
    assert d.items[0].store is False
    others = evaluate(policy(every("redact")), texts=[EVERYTHING], **ARGS)
    assert others.items[0].store is True, "redact alone still stores"


@detectors
def test_no_store_alone_fires_for_each_detector(name: str) -> None:
    texts = ["clean text", f"see {VALUES[name]} here", "more clean text"]
    d = evaluate(policy(every("no_store")), texts=texts, **ARGS)
    assert [i.store for i in d.items] == [True, False, True]
    assert d.items[1].detectors == (name,)
    assert d.not_stored == (1,)


@detectors
def test_reject_of_any_one_detector_rejects(name: str) -> None:
    with pytest.raises(PolicyRejected) as err:
        evaluate(policy(every("redact", **{name: "reject"})), texts=["clean", EVERYTHING],
                 **ARGS)
    assert err.value.status == 422
    assert name in str(err.value) and VALUES[name] not in str(err.value)


@detectors
def test_redact_masks_each_detectors_value(name: str) -> None:
    d = evaluate(policy(every("redact")), texts=[f"see {VALUES[name]} here"], **ARGS)
    assert d.items[0].text == f"see {LABELS[name]} here"
    assert d.items[0].store is True
    everything = evaluate(policy(every("redact")), texts=[EVERYTHING], **ARGS)
    masked = everything.items[0].text
    assert LABELS[name] in masked and VALUES[name] not in masked


@detectors
def test_a_detector_left_off_does_not_act(name: str) -> None:
    actions = every("no_store")
    del actions[name]
    d = evaluate(policy(actions), texts=[f"see {VALUES[name]} here"], **ARGS)
    assert (d.items[0].store, d.items[0].detectors) == (True, ())


@detectors
def test_every_field_of_a_request_is_checked(name: str) -> None:
    groups = [("query", ["a clean query"]), ("documents", ["clean", f"doc {VALUES[name]}"])]
    d = evaluate_groups(policy(every("no_store")), groups=groups, **ARGS)
    assert [i.store for i in d.items] == [True, True, False]
    with pytest.raises(PolicyRejected):
        evaluate_groups(policy(every("reject")), groups=groups, **ARGS)


def test_evaluate_matches_the_rule_by_route_model_tenant_and_header() -> None:
    from gateway.policy import Match

    rules = (
        Rule(name="by-route", match=Match(routes=("/v1/rank",))),
        Rule(name="by-model", match=Match(models=("big-*",))),
        Rule(name="by-tenant", match=Match(tenants=("beta",))),
        Rule(name="by-header", match=Match(headers={"x-team": "search"})),
        Rule(name="rest"),
    )
    p = Policy(version="v1", rules=rules)

    def rule(**changes: Any) -> str:
        return evaluate(p, texts=["t"], **{**ARGS, **changes}).rule.name

    assert rule() == "rest"
    assert rule(route="/v1/rank") == "by-route"
    assert rule(model="big-one") == "by-model"
    assert rule(tenant="beta") == "by-tenant"
    assert rule(headers={"x-team": "search"}) == "by-header"


def test_explain_names_every_field_of_the_decision() -> None:
    d = evaluate(policy(every("no_store")), texts=["clean", f"see {VALUES['ip']}"], **ARGS)
    assert d.explain() == {
        "rule": "r", "rule_origin": d.rule.origin, "policy_version": "v1", "trail": "r@v1",
        "cacheable": True, "cache": True, "scope": "tenant", "scope_key": "acme",
        "ttl_s": d.rule.ttl_s, "stale_while_revalidate_s": d.rule.stale_while_revalidate_s,
        "stale_if_error_s": d.rule.stale_if_error_s,
        "normalization": d.rule.normalization.fingerprint, "detectors": ["ip"],
        "actions": {"ip": "no_store"}, "items": 2, "not_stored": [1],
    }


def test_findings_come_in_text_order_and_a_longer_span_masks_a_shorter_one() -> None:
    from gateway.policy.pii import Finding, redact, scan

    text = "host 10.0.0.1 mail jane.doe@example.com"
    assert [f.detector for f in scan(text, {"email", "ip"})] == ["ip", "email"]
    assert redact("abcdef!", [Finding("phone", 0, 3), Finding("card", 0, 6)]) == "[CARD]!"
