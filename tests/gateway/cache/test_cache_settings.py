"""Cache settings: defaults, validation messages that name the field, no password in repr."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache.settings import CacheSettings, MiB, RedisSettings


def test_defaults() -> None:
    s = RedisSettings(url="redis://127.0.0.1:6379/0")
    assert (s.timeout_s, s.failure_threshold, s.key_prefix, s.is_cluster) == (
        0.1, 3, "gw:v1", False,
    )
    assert CacheSettings().max_bytes == 256 * MiB
    off = RedisSettings()  # no URL: no Redis tier
    assert off.url is None and not off.is_cluster
    with pytest.raises(ValueError, match="url"):
        off.client_url  # noqa: B018 (the property raises)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "http://127.0.0.1"),
        ("url", ""),
        ("timeout_s", 0),
        ("timeout_s", float("nan")),
        ("timeout_s", "0.1"),
        ("connect_timeout_s", -1),
        ("failure_threshold", 0),
        ("failure_threshold", 1.5),
        ("open_s", 0),
        ("key_prefix", ""),
        ("key_prefix", "gw:*"),
        ("key_prefix", "gw v1"),
        ("max_connections", 0),
        ("cluster", "yes"),
    ],
)
def test_bad_redis_values_name_the_field(field: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"url": "redis://h:1", field: value}
    with pytest.raises(ValueError, match=field):
        RedisSettings(**kwargs)


@pytest.mark.parametrize(("field", "value"), [("max_entries", 0), ("max_bytes", -1),
                                              ("max_bytes", 0), ("max_entries", True)])
def test_bad_cache_values_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        CacheSettings(**{field: value})


def test_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        RedisSettings("redis://h:1")  # type: ignore[call-arg]
    s = RedisSettings(url="redis://h:1")
    with pytest.raises(AttributeError):
        s.timeout_s = 1  # type: ignore[misc]


def test_cluster_from_scheme_and_tls() -> None:
    s = RedisSettings(url="rediss+cluster://h:7000")
    assert s.is_cluster and s.client_url == "rediss://h:7000"
    assert RedisSettings(url="redis://h:1", cluster=True).is_cluster
    assert RedisSettings(url="rediss://h:1").client_url == "rediss://h:1"


def test_repr_hides_the_password() -> None:
    s = RedisSettings(url="redis://user:hunter2@cache.internal:6380/1")
    assert "hunter2" not in repr(s)
    assert "user:***@cache.internal:6380" in repr(s)
