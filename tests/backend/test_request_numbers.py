"""Numbers the backend reads from requests (issue 20, items 4 and 12): ASCII digits only in
headers, a deadline from 1 ms, and integer-valued JSON numbers taken as the integers JSON Schema
(and the OpenAPI document) count them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from backend import handlers, openai
from backend.envelope import timeout_from_header, whole
from backend.errors import BadRequest
from tests.backend.test_oip import parse, text_input


@pytest.mark.parametrize("value", ["٣", "\uff15", "²", "1_000", "0.5", "5e-324", " 5", "0x10",
                                   "+20", "600001"])
def test_an_unusable_deadline_is_400(value: str) -> None:
    with pytest.raises(BadRequest, match="X-Request-Timeout-Ms"):
        timeout_from_header(value)


@pytest.mark.parametrize(("value", "seconds"), [("1", 0.001), ("1e3", 1.0), ("2500.5", 2.5005),
                                                ("600000", 600.0)])
def test_a_plain_decimal_deadline_from_1_ms_is_taken(value: str, seconds: float) -> None:
    assert timeout_from_header(value) == pytest.approx(seconds)
    assert timeout_from_header(None) is None  # absent: the priority level's default timeout


@pytest.mark.parametrize("value", ["²", "٣", " 5", "+5", "5_0"])
def test_the_binary_header_length_takes_ascii_digits_only(value: str) -> None:
    with pytest.raises(BadRequest, match="must be an integer"):
        handlers._json_length(value)
    assert handlers._json_length("12") == 12


@pytest.mark.parametrize(("value", "expected"), [(3, 3), (3.0, 3), (True, None), (3.5, None),
                                                  (float("inf"), None), ("3", None)])
def test_whole(value: Any, expected: int | None) -> None:
    assert whole(value) == expected


def test_integer_valued_numbers_are_integers() -> None:
    request = parse(text_input(["a", "b"], shape=[2.0]))  # type: ignore[list-item]
    assert request.texts == ["a", "b"]
    body = orjson.dumps({"model": "minilm", "input": "x", "dimensions": 384.0})
    assert openai.parse_embeddings_request(body, max_items=8).dimensions == 384
    with pytest.raises(BadRequest):
        parse(text_input(["a", "b"], shape=[2.5]))  # type: ignore[list-item]


def test_numbers_in_backend_variables_are_ascii() -> None:
    from backend.settings import ServeSettings, SettingsError

    assert ServeSettings.from_env({"BACKEND_MAX_QUEUE_SIZE": "12"}).max_queue_size == 12
    with pytest.raises(SettingsError, match="BACKEND_MAX_QUEUE_SIZE"):
        ServeSettings.from_env({"BACKEND_MAX_QUEUE_SIZE": "١٢"})
