"""PII detectors: each with positives and look-alike negatives, checksums, redaction, and the
folded forms (other scripts' digits, invisible characters) mapped back to the original text."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy import DETECTORS, Finding, Policy, Privacy, Rule, evaluate, redact, scan
from gateway.policy.detectors import iban_valid, luhn_valid


def found(text: str, detector: str) -> list[str]:
    return [text[f.start:f.end] for f in scan(text, {detector})]


POSITIVES = {
    "email": [
        ("write to john.doe+tag@mail.example.co.uk today", "john.doe+tag@mail.example.co.uk"),
        ("josé@exämple.de", "josé@exämple.de"),
        ("ADMIN@EXAMPLE.ORG.", "ADMIN@EXAMPLE.ORG"),
    ],
    "phone": [
        ("call (555) 123-4567 now", "(555) 123-4567"),
        ("call 555-123-4567.", "555-123-4567"),
        ("or 555.123.4567", "555.123.4567"),
        ("UK 020 7946 0958", "020 7946 0958"),
        ("mobile 07700 900123", "07700 900123"),
        ("DE +49 30 1234567", "+49 30 1234567"),
        ("+44 20 7946 0958", "+44 20 7946 0958"),
        ("+1 (555) 123-4567", "+1 (555) 123-4567"),
        ("+1-555-123-4567", "+1-555-123-4567"),
        ("FR +33 1 23 45 67 89", "+33 1 23 45 67 89"),
        ("tel:030/1234567", "030/1234567"),
    ],
    "card": [
        ("4111111111111111", "4111111111111111"),
        ("card 4111-1111-1111-1111 exp 12/25", "4111-1111-1111-1111"),
        ("visa 4111 1111 1111 1111.", "4111 1111 1111 1111"),
        ("amex 3782 822463 10005", "3782 822463 10005"),
        ("mc 5500 0000 0000 0004", "5500 0000 0000 0004"),
    ],
    "us_ssn": [("ssn 123-45-6789", "123-45-6789"), ("(078-05-1120)", "078-05-1120")],
    "iban": [
        ("iban DE89 3704 0044 0532 0130 00 please", "DE89 3704 0044 0532 0130 00"),
        ("DE89370400440532013000", "DE89370400440532013000"),
        ("GB82 WEST 1234 5698 7654 32", "GB82 WEST 1234 5698 7654 32"),
        ("gb82west12345698765432", "gb82west12345698765432"),  # case-folded
    ],
    "ip": [
        ("host 10.0.0.1:8080", "10.0.0.1"),
        ("from 192.168.100.200.", "192.168.100.200"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("mapped ::ffff:192.168.1.1 here", "::ffff:192.168.1.1"),
        ("link fe80::1%eth0", "fe80::1"),
    ],
    "secret": [
        ("key sk-proj-Ab3dE5fG7hJ9kL1mN3pQ5rS7", "sk-proj-Ab3dE5fG7hJ9kL1mN3pQ5rS7"),
        ("ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
        ("aws AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        ("aws akiaiosfodnn7example", "akiaiosfodnn7example"),  # case-folded
        ("slack xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
         "xoxb-123456789012-1234567890123-AbCdEfGhIjKl"),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456",
         "abcdefghijklmnopqrstuvwxyz123456"),
        ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
         "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
         "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
         "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
        ("sha 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
         "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
        ("key=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ubw==",
         "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ubw"),
    ],
}

NEGATIVES = {
    "email": ["user at example dot com", "@handle on social", "a@b", "foo@localhost",
              "look at example.com for details", "the dot com boom at its height",
              "get v2.1 at python.org", "curl -d @body.json http://x", "LOOK AT THE DOT COM"],
    "phone": [
        "in 2024 we sold 1,299 units at $19.99 each",
        "order #123456 and order #5551234567",
        "order #555-123-4567",
        "dates 2024-01-15 and 01/02/2023 10:30",
        "ISBN 978-3-16-148410-0",
        "room 555 1234",
        "+5 points, +10 more",
        "version 1.2.3.4567",
        "iban DE89 3704 0044 0532 0130 00",  # the IBAN's digit groups are not a phone
        "code 123 456 7890",  # no area code starts with 1
        "timestamp 1710412800",
        "invoice 2024031401",  # a date, not a number to call
        "ISBN 0306406152",
        "id 5551234567890",  # too long for a bare phone number
    ],
    "card": [
        "4111 1111 1111 1112",  # Luhn fails
        "0000 0000 0000 0000",
        "order 12345678901234567890123",
        "tel 555-123-4567",
        "41111111111",  # too short
        "4111 1111.1111-1111",  # one separator between all groups
        "1 234 567 890 123 456",  # thousands, not card groups
        "ISBN 9780306406157",
        "9780306406157",  # an ISBN-13 passes Luhn one time in ten; this one does not matter
    ],
    "us_ssn": ["000-12-3456", "666-12-3456", "923-45-6789", "123-00-4567", "123-45-0000",
               "id 1123-45-6789", "2024-01-15", "order 123456789", "123/45/6789",
               "ssn 000000000"],
    "iban": ["DE89370400440532013001", "XX00 1234 5678", "ABCD1234567890"],
    "ip": ["999.1.1.1", "1.2.3.4.5", "time 12:30:45", "std::vector", "MAC 00:1A:2B:3C:4D:5E",
           "value 3.14 and 2.0", "v1.2.3.4.5.6", "listen on 0.0.0.0", "127.1 apples",
           "2130706433 bytes", "0x7f000001 in a register", "0400.0.0.1", "http://example.com/",
           "http://cafe.be/"],
    "secret": [
        "task-management-system-for-teams",
        "sk-learn-is-a-great-library",
        "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "/usr/local/lib/python3/site-packages/numpy/core/multiarray",
        "internationalization_configuration_manager_v2_final",
        "the_quick_brown_fox_jumps_over_the_lazy_dog_2024_edition",
        "https://docs.python.org/3/library/re.html#re.Pattern.search",
        "Bearer short",
        "Password: choose one you have not used before.",
        "set password=<your password> in the file",
        "DB_PASSWORD=${DB_PASSWORD}",
        "api_key=YOUR_API_KEY",
        "password=****",
        "bypass=1 and compass=north",
        "The basic plan costs $9.99",
        "Basic usage is covered in chapter 2",
        "boarding pass: gate 12",
        "https://example.com/login?next=/home",
        "postgres://app@db.internal/app",
        "eyJhbGciOiJub25lIn0 alone",
    ],
}


@pytest.mark.parametrize(("detector", "text", "value"),
                         [(d, t, v) for d, cases in POSITIVES.items() for t, v in cases])
def test_detector_finds(detector: str, text: str, value: str) -> None:
    assert found(text, detector) == [value]


@pytest.mark.parametrize(("detector", "text"),
                         [(d, t) for d, cases in NEGATIVES.items() for t in cases])
def test_detector_ignores_look_alikes(detector: str, text: str) -> None:
    assert found(text, detector) == []


def test_ordinary_prose_with_numbers_has_no_findings() -> None:
    text = ("Thanks for order #48213 placed on 2024-03-14. The total was $129.99; version 4.2.1 "
            "fixes ticket 7731. Call me back in 3 to 5 days, at 10:30 or 14:45.") * 8
    assert scan(text, DETECTORS) == []


def test_only_the_requested_detectors_run() -> None:
    text = "a@b.example.com 4111 1111 1111 1111"
    assert {f.detector for f in scan(text, {"card"})} == {"card"}
    assert scan(text, set()) == []
    assert scan("", DETECTORS) == []


def test_findings_are_ordered_and_one_detector_never_overlaps_itself() -> None:
    text = "+44 20 7946 0958 then a@b.com then 10.0.0.1"
    findings = scan(text, DETECTORS)
    assert [f.detector for f in findings] == ["phone", "email", "ip"]
    assert findings == sorted(findings, key=lambda f: f.start)
    # Two detectors' findings that start together: the longer first (the span that covers).
    assert scan("10.0.0.1@x.com", DETECTORS) == [Finding("email", 0, 14), Finding("ip", 0, 8)]
    # One detector's overlapping forms of one value merge into one finding.
    assert scan("a@b.coc@d.co", {"email"}) == [Finding("email", 0, 12)]


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert luhn_valid("79927398713")
    assert luhn_valid("378282246310005")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("79927398710")


def test_iban_checksum() -> None:
    assert iban_valid("DE89 3704 0044 0532 0130 00")
    assert iban_valid("gb82west12345698765432")
    assert not iban_valid("DE88 3704 0044 0532 0130 00")
    assert not iban_valid("DE89")  # too short
    assert not iban_valid("DE89 3704 0044 0532 0130 0!")


def test_redact_masks_each_finding_with_its_label() -> None:
    text = "mail a@b.com or call 555-123-4567, card 4111 1111 1111 1111."
    assert redact(text, scan(text, DETECTORS)) == "mail [EMAIL] or call [PHONE], card [CARD]."
    assert redact(text, []) is text


def test_redact_merges_overlapping_findings() -> None:
    text = "0123456789"
    findings = [Finding("card", 2, 6), Finding("phone", 4, 8), Finding("ip", 8, 9)]
    assert redact(text, findings) == "01[CARD][IP]9"


def _with_luhn_digit(body: str) -> str:
    for last in "0123456789":
        if luhn_valid(body + last):
            return body + last
    raise AssertionError("unreachable: one check digit always fits")


CARD_NUMBERS = st.builds(
    lambda first, rest: _with_luhn_digit(first + rest),
    st.sampled_from("3456"),
    st.text(alphabet="0123456789", min_size=11, max_size=17),
)


def _grouped(number: str, sep: str) -> str:
    return sep.join(number[i:i + 4] for i in range(0, len(number), 4))


# Digits as people type them: ASCII, full-width, Arabic-Indic, Devanagari.
DIGIT_SCRIPTS = ["0123456789", "".join(map(chr, range(0xFF10, 0xFF1A))),
                 "".join(map(chr, range(0x0660, 0x066A))), "".join(map(chr, range(0x0966, 0x0970)))]


@settings(max_examples=300, deadline=None, database=None)
@given(number=CARD_NUMBERS,
       sep=st.sampled_from(["", " ", "-", ".", "/", "_", "\u2013", "\u2014", "\u2212", "\uff0d"]),
       digits=st.sampled_from(DIGIT_SCRIPTS),
       before=st.sampled_from(["", "card ", "pay with: ", "(", "no. "]),
       after=st.sampled_from(["", " thanks", ".", ", exp 12/27", ")"]))
def test_every_luhn_valid_card_is_detected(number: str, sep: str, digits: str, before: str,
                                           after: str) -> None:
    formatted = _grouped(number, sep).translate(str.maketrans("0123456789", digits))
    text = before + formatted + after
    assert found(text, "card") == [formatted]


@settings(max_examples=200, deadline=None, database=None)
@given(number=CARD_NUMBERS)
def test_a_wrong_check_digit_is_not_a_card(number: str) -> None:
    wrong = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert found(_grouped(wrong, " "), "card") == []


PII_VALUES = [v for cases in POSITIVES.values() for _, v in cases]
FILLER = st.text(alphabet="abcdefghij klmnop,.!?", max_size=30)


@settings(max_examples=300, deadline=None, database=None)
@given(parts=st.lists(st.tuples(FILLER, st.sampled_from(PII_VALUES)), min_size=1, max_size=4),
       tail=FILLER)
def test_redaction_removes_every_finding(parts: list[tuple[str, str]], tail: str) -> None:
    text = "".join(f"{filler} {value} " for filler, value in parts) + tail
    findings = scan(text, DETECTORS)
    masked = redact(text, findings)
    for f in findings:
        assert text[f.start:f.end] not in masked
    assert scan(masked, DETECTORS) == []


INVISIBLE = st.sampled_from(["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"])


@settings(max_examples=300, deadline=None, database=None)
@given(case=st.sampled_from([(d, *c) for d, cases in POSITIVES.items() for c in cases]),
       data=st.data())
def test_invisible_characters_inside_a_value_do_not_hide_it(case: tuple[str, str, str],
                                                            data: st.DataObject) -> None:
    detector, text, value = case
    cuts = data.draw(st.lists(st.integers(1, len(value) - 1), min_size=1, max_size=3,
                              unique=True))
    hidden = value
    for cut in sorted(cuts, reverse=True):
        hidden = hidden[:cut] + data.draw(INVISIBLE) + hidden[cut:]
    assert found(text.replace(value, hidden, 1), detector) == [hidden]


def test_redaction_masks_the_original_characters_of_a_folded_value() -> None:
    # Folding changes lengths (a zero-width space is removed) and characters (full-width
    # digits): the mask still covers exactly the value as written, and nothing else changes.
    text = ("Karte \uff14\uff11\uff11\uff11\u3000\uff11\uff11\uff11\uff11\u3000"
            "\uff11\uff11\uff11\uff11\u3000\uff11\uff11\uff11\uff11\u3001"
            "mail jo\u200bhn.doe\uff20example.com\u3002\uff08\uff11\uff09")
    findings = scan(text, DETECTORS)
    assert [f.detector for f in findings] == ["card", "email"]
    assert redact(text, findings) == "Karte [CARD]\u3001mail [EMAIL]\u3002\uff08\uff11\uff09"


def test_the_backend_and_the_key_see_the_normalised_text_not_the_folded_one() -> None:
    rule = Rule(name="r", privacy=Privacy(detectors={"card": "redact", "email": "no_store"}))
    policy = Policy(version="v1", rules=(rule,))
    args: dict[str, Any] = {"route": "/v1/embeddings", "model": "minilm", "tenant": "t",
                            "headers": {}}
    card = "\uff14\uff11\uff11\uff11" + "\uff0d\uff11\uff11\uff11\uff11" * 3  # 4111-1111-...
    text = f"\uff12\uff10\uff12\uff14\u5e74 {card} \u2014 ok"  # a year, a card, an em dash
    decision = evaluate(policy, texts=[text, "mail jo\u200bhn@example.com"], **args)
    assert decision.items[0].text == "\uff12\uff10\uff12\uff14\u5e74 [CARD] \u2014 ok"
    assert decision.items[0].store is True
    assert decision.items[1].text == "mail jo\u200bhn@example.com"
    assert decision.items[1].store is False


@settings(max_examples=200, deadline=None, database=None)
@given(text=st.text(max_size=200))
def test_scan_never_fails_and_spans_are_in_bounds(text: str) -> None:
    for f in scan(text, DETECTORS):
        assert 0 <= f.start < f.end <= len(text)
        assert f.detector in DETECTORS


def test_scan_is_fast_enough_on_large_text_without_pii() -> None:
    # Not a timing assertion: a smoke test that a 64 KB text with many numbers completes and
    # finds nothing (guards against quadratic candidate loops).
    rng = random.Random(7)
    words = ["order", "#" + str(rng.randrange(10**6)), "2024-03-14", "$19.99", "v4.2.1", "and"]
    text = " ".join(rng.choice(words) for _ in range(8000))
    assert scan(text, DETECTORS) == []


# The cheapest values each detector accepts: the pre-checks that let ``detect`` skip a detector
# (at least 8 digits for the number-like ones, 4 for an IPv4 address, an IBAN's digit groups)
# must never skip one of these.
@pytest.mark.parametrize(("detector", "text", "value"), [
    ("phone", "call +41 234 567 now", "+41 234 567"),  # 8 digits, the fewest
    ("ip", "host 1.2.3.4 here", "1.2.3.4"),  # 4 digits
    ("iban", "pay DE89 3704 0044 0532 0130 00 ok", "DE89 3704 0044 0532 0130 00"),
    ("iban", "pay DE89-3704-0044-0532-0130-00 ok", "DE89-3704-0044-0532-0130-00"),
    ("iban", "pay DE89370400440532013000 ok", "DE89370400440532013000"),
    # Qatar's account number is alphanumeric: a run of only 8 digits, ungrouped.
    ("iban", "pay QA27DOHB12345678ABCDEFGHIJKLM ok", "QA27DOHB12345678ABCDEFGHIJKLM"),
    ("ip", "mail from [2001:db8::1]", "2001:db8::1"),
])
def test_the_smallest_values_pass_the_pre_checks(detector: str, text: str, value: str) -> None:
    assert found(text, detector) == [value]


def test_one_detectors_overlapping_spans_merge_around_another_detectors_span() -> None:
    # Two credential forms see overlapping secrets (9-30 and 22-30) while an IPv6 address starts
    # inside the first: the merge is per detector, so the secret is one finding, not two
    # findings of one detector overlapping each other on either side of the IP.
    text = "password=::1/password=hunter2:"
    found = scan(text, DETECTORS)
    assert found == [Finding("secret", 9, 30), Finding("ip", 9, 12)]
    for name in {f.detector for f in found}:
        mine = [f for f in found if f.detector == name]
        assert all(a.end <= b.start for a, b in itertools.pairwise(mine))


def test_adjacent_spans_of_one_detector_stay_two_findings() -> None:
    # A bearer token ends exactly where the next credential's value starts: two values, two
    # labels (merging touching spans would hide that two secrets were there).
    text = "Bearer WIiOiIxIn0.abc/pass=@89"
    found = scan(text, DETECTORS)
    assert found == [Finding("secret", 7, 27), Finding("secret", 27, 30)]
    assert redact(text, found) == "Bearer [SECRET][SECRET]"


def test_clean_text_enters_no_detector_whose_needle_is_absent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prose without ``@``, ``:`` or ``basic `` walks no e-mail candidates, URLs or Basic
    credentials (issue 24: a call each on every request); with the needle they still run."""
    from gateway.policy import contacts, credentials

    entered: list[str] = []
    basic, finds = credentials._basic, contacts.finds
    monkeypatch.setattr(credentials, "_basic",
                        lambda s, out: (entered.append("basic"), basic(s, out))[1])
    monkeypatch.setattr(contacts, "finds",
                        lambda hay, needle: (entered.append(needle), finds(hay, needle))[1])
    assert scan("a new sentence 12 to embed, nothing private", DETECTORS) == []
    assert entered == []
    found = scan("Authorization: Basic dXNlcjpwYXNzd29yZA== and me@example.com", DETECTORS)
    assert {f.detector for f in found} == {"secret", "email"}
    assert "basic" in entered and "@" in entered
