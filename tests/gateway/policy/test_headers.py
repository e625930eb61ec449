"""The one reading of request headers (gateway/policy/headers.py) and how rules match on it."""

from __future__ import annotations

from multidict import CIMultiDict

from gateway.policy.headers import RequestHeaders, candidates
from gateway.policy.model import Match, Policy, Rule


def test_every_value_is_kept_in_order_and_hidden_headers_never_are() -> None:
    h = RequestHeaders([("X-Debug", "0"), ("Authorization", "Bearer k"), ("x-debug", "1"),
                        ("Cookie", "c"), ("Cache-Control", "max-age=5"),
                        ("cache-control", "no-store")])
    assert h.values_of("x-debug") == ("0", "1")
    assert "authorization" not in h and "cookie" not in h
    assert h.joined("cache-control") == "max-age=5, no-store"
    assert h.values_of("absent") == () and h.joined("absent") is None
    assert "Bearer" not in repr(h) and "0" not in repr(h), "names only"


def test_read_from_a_request_it_gives_the_same_values_name_by_name() -> None:
    lines = [("X-Debug", "0"), ("Authorization", "Bearer k"), ("x-debug", "1"),
             ("Cache-Control", "no-store"), ("X-Empty", "")]
    lazy = RequestHeaders.of(CIMultiDict(lines))
    assert lazy.values_of("x-debug") == ("0", "1") and lazy.values_of("authorization") == ()
    assert "cache-control" in lazy and "authorization" not in lazy and "x-empty" in lazy
    assert lazy.joined("cache-control") == "no-store" and lazy.get("absent") is None
    assert dict(lazy) == dict(RequestHeaders(lines))


def test_candidates_are_each_line_and_each_comma_element() -> None:
    assert candidates(("0", " 1 , 2")) == ("0", "1 , 2", "1", "2")


def test_a_header_condition_holds_when_any_value_meets_it() -> None:
    debug = Rule(name="debug", match=Match(headers={"x-debug": "1"}), cache=False)
    policy = Policy(version="v", rules=(debug, Rule(name="default")))

    def rule(*lines: tuple[str, str]) -> str:
        return policy.match(route="/v1/embeddings", model="minilm", tenant="t",
                            headers=RequestHeaders(lines)).name

    assert rule(("X-Debug", "0"), ("X-Debug", "1")) == "debug"
    assert rule(("X-Debug", "1"), ("X-Debug", "0")) == "debug"
    assert rule(("X-Debug", "0, 1")) == "debug"
    assert rule(("X-Debug", "0")) == "default"
    assert rule() == "default"
    glob = Match(headers={"user-agent": "curl/*"})
    assert glob.matches(route="r", model="m", tenant="t",
                        headers=RequestHeaders([("User-Agent", "x"), ("User-Agent", "curl/8")]))
    assert glob.matches(route="r", model="m", tenant="t", headers={"user-agent": "curl/8"}), \
        "a plain dict (policy explain) still gives one value per header"
