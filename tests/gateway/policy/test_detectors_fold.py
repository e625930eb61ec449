"""fold(): the detectors' ASCII copy of a text, and spans mapped back to the original."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.fold import _MAX_DISTINCT, _tables, fold


def test_ascii_text_is_returned_as_it_is() -> None:
    text = "card 4111-1111-1111-1111, mail a@b.com"
    folded = fold(text)
    assert folded.text is text
    assert not folded.resized
    assert folded.span(5, 24) == (5, 24)


@pytest.mark.parametrize(("text", "expected"), [
    ("\uff14\uff11\uff11\uff11\uff0d\uff11\uff11", "4111-11"),  # full-width digits and hyphen
    ("\u0664\u0661\u0661\u0661 \u0661\u0661", "4111 11"),  # Arabic-Indic digits
    ("\u06f4\u06f1\u06f1", "411"),  # Extended Arabic-Indic (Persian) digits
    ("\u096a\u0967\u0967", "411"),  # Devanagari digits
    ("\U0001d7d2\U0001d7cf", "41"),  # mathematical bold digits (outside the BMP)
    ("555\u2013123\u2014456\u2212789\u2010", "555-123-456-789-"),  # en/em dash, minus, hyphen
    ("1\u00b72\u30023\uff0e4\u2024", "1.2.3.4."),  # middle dot, ideographic and other stops
    ("1\u22152\u20443\uff0f4", "1/2/3/4"),  # division, fraction and full-width slash
    ("a\uff3fb", "a_b"),
    ("john\uff20example\uff0ecom", "john@example.com"),
    ("\uff0b44\u300020", "+44 20"),  # full-width plus, ideographic space
    ("\uff4a\uff4f\uff48\uff4e", "john"),  # full-width letters
    ("\ufb01sher", "fisher"),  # a ligature
])
def test_lookalikes_fold_to_ascii(text: str, expected: str) -> None:
    assert fold(text).text == expected


@pytest.mark.parametrize("char", ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad",
                                  "\u202e", "\U000e0041"])
def test_format_characters_are_removed(char: str) -> None:
    assert fold(f"jo{char}hn@exam{char}ple.com").text == "john@example.com"


@pytest.mark.parametrize("text", ["10\u00b2", "\u00bd cup", "step \u2460", "Grüße aus Köln",
                                  "naïve café", "\u2026", "Widget\u2122", "\u4f1a\u8bae",
                                  "\U0001f600 ok", "\U0001f1e9\U0001f1ea"])
def test_other_characters_stay(text: str) -> None:
    # Superscripts, fractions and circled numbers are not digits one writes a number with
    # ("10²" is not 102); letters, ellipses, symbols, CJK and emoji are not look-alikes.
    assert fold(text).text == text


def test_spans_map_back_over_removed_and_expanded_characters() -> None:
    text = "x \ufb01 jo\u200bhn@ex\u00adample.com y"
    folded = fold(text)
    assert folded.resized
    start = folded.text.index("john")
    end = folded.text.index(" y")
    assert text[slice(*folded.span(start, end))] == "jo\u200bhn@ex\u00adample.com"
    assert folded.span(2, 3) == (2, 3)  # the "f" of the ligature is the whole ligature
    assert folded.span(3, 4) == (2, 3)


def test_the_fast_paths_know_their_foldable_characters() -> None:
    t = _tables()
    assert t.latin1 == "\u00a0\u00aa\u00ad\u00b7\u00ba"
    assert t.cp1252 == "\u2013\u2014\u00a0\u00aa\u00ad\u00b7\u00ba"


@pytest.mark.parametrize("text", ["caf\u00e9\u00a0\u00b7 a\u00adb",
                                  "\u201ccaf\u00e9\u201d \u2014 \u20ac5",
                                  "\u201ccaf\u00e9\u201d \u2014 \u20ac5 \u0661"])
def test_every_path_folds_the_same(text: str) -> None:
    # Latin-1, Windows-1252 and other text (here an Arabic-Indic digit) take three paths.
    assert fold(text).text == text.translate(_tables().table)


def test_the_table_follows_the_unicode_database() -> None:
    table = _tables().table
    assert table[0x0669] == "9"  # ARABIC-INDIC DIGIT NINE
    assert table[0x200B] == ""
    assert all(unicodedata.category(chr(cp)) == "Cf" for cp, v in table.items() if v == "")
    assert all(v.isascii() for v in table.values())
    assert 0x00B2 not in table  # SUPERSCRIPT TWO


FOLDABLE = [chr(cp) for cp in sorted(_tables().table)]
ALPHABET = st.sampled_from([*FOLDABLE, "a", "1", " ", "@", ".", "\u00e9", "\u20ac", "\U0001f600"])


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.text(alphabet=ALPHABET, max_size=60))
def test_fold_equals_translating_every_character(text: str) -> None:
    # Whichever path fold takes (Latin-1, one replace per character, or translate past
    # _MAX_DISTINCT kinds), the result is the per-character table applied to the text.
    table = _tables().table
    folded = fold(text)
    assert folded.text == text.translate(table)
    for k in range(len(folded.text)):
        start, end = folded.span(k, k + 1)
        assert folded.text[k] in text[start:end].translate(table)


def test_many_kinds_of_foldable_character_take_one_linear_pass() -> None:
    text = "".join(FOLDABLE[: 3 * _MAX_DISTINCT]) * 3
    assert fold(text).text == text.translate(_tables().table)
