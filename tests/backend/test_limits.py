"""Request limits (pure): the checks, the setting, and defaults that fit the gateway's traffic."""

from __future__ import annotations

import orjson
import pytest
import yaml

from backend.errors import BadRequest, PayloadTooLarge
from backend.limits import RequestLimits, text_bytes
from backend.settings import ServeSettings, SettingsError
from tests.conftest import REPO


def test_defaults_fit_the_gateways_largest_request() -> None:
    """The gateway's default policy (its max texts, each at its max length) is never refused."""
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text(encoding="utf-8"))
    norm = policy["defaults"]["normalization"]
    settings = ServeSettings()
    texts = ["a" * norm["max_chars"]] * norm["max_items"]
    RequestLimits(max_items=settings.max_items_per_request,
                  max_text_bytes=settings.max_text_bytes_per_request).check(texts)
    body = orjson.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                                     "data": texts}], "parameters": {"binary_data_output": True}})
    assert len(body) <= settings.client_max_size


def test_text_bytes_counts_utf8() -> None:
    assert text_bytes(["abc", "é", "€", "😀", ""]) == 3 + 2 + 3 + 4


def test_limits_check_items_then_bytes() -> None:
    limits = RequestLimits(max_items=2, max_text_bytes=4)
    limits.check(["ab", "cd"])
    limits.check(["é", "é"])
    with pytest.raises(BadRequest, match="too many items: 3 texts; at most 2"):
        limits.check(["", "", ""])
    with pytest.raises(PayloadTooLarge, match="texts of 6 bytes in all exceed the limit of 4"):
        limits.check(["abc", "€"])


def test_text_byte_limit_is_a_validated_setting() -> None:
    assert ServeSettings.from_env(
        {"BACKEND_MAX_TEXT_BYTES_PER_REQUEST": "1000"}).max_text_bytes_per_request == 1000
    with pytest.raises(SettingsError, match="max_text_bytes_per_request"):
        ServeSettings(max_text_bytes_per_request=0)
