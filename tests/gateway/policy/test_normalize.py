"""Normalization: Unicode form, case folding, whitespace, length limits; idempotent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ValidationFailed
from gateway.policy import Normalization, normalize_text

DEFAULT = Normalization()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hello world", "hello world"),
        ("  hello \t\n world  ", "hello world"),
        ("a\u00a0\u2003b\u3000c\u2028d", "a b c d"),  # Unicode whitespace collapses too
        ("line\x1cone", "line one"),  # str.split() separators count as whitespace
        ("", ""),
        ("   ", ""),
    ],
)
def test_whitespace_collapse(text: str, expected: str) -> None:
    assert normalize_text(text, DEFAULT) == expected


def test_clean_ascii_text_is_returned_unchanged_without_a_copy() -> None:
    text = "Already canonical text, 1234."
    assert normalize_text(text, DEFAULT) is text


def test_whitespace_strip_and_keep() -> None:
    text = "  a   b \n"
    assert normalize_text(text, Normalization(whitespace="strip")) == "a   b"
    assert normalize_text(text, Normalization(whitespace="keep")) == text


def test_unicode_forms() -> None:
    decomposed = "Cafe\u0301"
    assert normalize_text(decomposed, DEFAULT) == "Caf\u00e9"
    assert normalize_text("Caf\u00e9", Normalization(unicode_form="NFD")) == decomposed
    assert normalize_text("\uff21\uff11", Normalization(unicode_form="NFKC")) == "A1"  # full width
    assert normalize_text(decomposed, Normalization(unicode_form="none")) == decomposed


def test_casefold() -> None:
    n = Normalization(casefold=True)
    assert normalize_text("Hello WORLD", n) == "hello world"
    assert normalize_text("Straße", n) == "strasse"
    assert normalize_text("Hello", DEFAULT) == "Hello"


def test_truncate_drops_whitespace_the_cut_exposes() -> None:
    n = Normalization(max_chars=6)
    assert normalize_text("hello world", n) == "hello"
    assert normalize_text("abcdefgh", n) == "abcdef"


def test_reject_over_max_chars_names_the_field_not_the_text() -> None:
    n = Normalization(max_chars=5, on_overflow="reject")
    with pytest.raises(ValidationFailed) as info:
        normalize_text("secret text here", n, field="input[3]")
    assert info.value.status == 422
    assert info.value.field == "input[3]"
    assert "secret" not in info.value.message
    assert normalize_text("  ok   ", n) == "ok"  # measured after normalization


def test_fingerprint_changes_with_text_affecting_fields_only() -> None:
    base = Normalization().fingerprint
    assert Normalization().fingerprint == base
    assert Normalization(casefold=True).fingerprint != base
    assert Normalization(unicode_form="NFKC").fingerprint != base
    assert Normalization(whitespace="keep").fingerprint != base
    assert Normalization(max_chars=100).fingerprint != base
    # Limits that never change an accepted text keep the cached entries.
    assert Normalization(max_items=3).fingerprint == base
    assert Normalization(on_overflow="reject").fingerprint == base


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match="unicode_form"):
        Normalization(unicode_form="NFX")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Normalization(max_chars=0)


NORMALIZATIONS = st.builds(
    Normalization,
    unicode_form=st.sampled_from(["NFC", "NFKC", "NFD", "NFKD", "none"]),
    casefold=st.booleans(),
    whitespace=st.sampled_from(["collapse", "strip", "keep"]),
    max_chars=st.integers(min_value=1, max_value=64),
)


@settings(max_examples=400, deadline=None, database=None)
@given(text=st.text(max_size=80), n=NORMALIZATIONS)
def test_normalize_is_idempotent(text: str, n: Normalization) -> None:
    once = normalize_text(text, n)
    assert normalize_text(once, n) == once
    assert len(once) <= n.max_chars


@settings(max_examples=200, deadline=None, database=None)
@given(text=st.text(alphabet=st.characters(max_codepoint=127), max_size=120))
def test_ascii_fast_path_matches_the_general_definition(text: str) -> None:
    expected = " ".join(text.split())[: DEFAULT.max_chars]
    assert normalize_text(text, DEFAULT) == expected
