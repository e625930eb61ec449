"""Key derivation: stable, sensitive to every field, unambiguously framed, no tenant in clear."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cache.keys import CacheKey, derive_key, scope_tag

BASE: dict[str, str] = {
    "route": "/v1/embeddings",
    "model": "minilm",
    "model_version": "1",
    "scope": "tenant-a",
    "normalization": "nfc-ws-v1",
}


def key(canonical: bytes = b"hello world", /, **over: str) -> CacheKey:
    fields = {**BASE, **over}
    return derive_key(canonical=canonical, **fields)


def test_stable_across_calls_and_pinned() -> None:
    assert key() == key()
    # Pinned so that an accidental framing change (which would orphan every cached entry and,
    # worse, could collide with old ones) fails loudly; bump _DOMAIN on purpose instead.
    assert key().hex == "9738b0de1f51e785ab594641d9af8b5b"
    assert len(key().digest) == 16


@pytest.mark.parametrize("field", sorted(BASE))
def test_every_field_changes_the_key(field: str) -> None:
    assert key(**{field: BASE[field] + "x"}).digest != key().digest


def test_canonical_bytes_change_the_key() -> None:
    assert key(b"hello world").digest != key(b"hello  world").digest
    assert key(b"").digest != key(b"\x00").digest


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"route": "ab", "model": "c"}, {"route": "a", "model": "bc"}),
        ({"model": "ab", "model_version": "c"}, {"model": "a", "model_version": "bc"}),
        ({"scope": "ab", "normalization": "c"}, {"scope": "a", "normalization": "bc"}),
    ],
)
def test_framing_is_unambiguous(a: dict[str, str], b: dict[str, str]) -> None:
    assert key(**a).digest != key(**b).digest


def test_normalization_and_canonical_boundary() -> None:
    assert key(b"c", normalization="ab").digest != key(b"bc", normalization="a").digest


@given(
    st.tuples(*[st.text(max_size=8)] * 5, st.binary(max_size=16)),
    st.tuples(*[st.text(max_size=8)] * 5, st.binary(max_size=16)),
)
def test_distinct_inputs_give_distinct_keys(
    a: tuple[str, str, str, str, str, bytes], b: tuple[str, str, str, str, str, bytes]
) -> None:
    def k(t: tuple[str, str, str, str, str, bytes]) -> bytes:
        return derive_key(route=t[0], model=t[1], model_version=t[2], scope=t[3],
                          normalization=t[4], canonical=t[5]).digest

    assert (k(a) == k(b)) == (a == b)


def test_redis_key_layout_hides_the_tenant() -> None:
    k = key(scope="tenant-secret-42")
    rk = k.redis_key("gw:v1")
    assert rk == f"gw:v1:minilm:{scope_tag('tenant-secret-42')}:{k.hex}"
    assert "tenant-secret-42" not in rk
    assert len(scope_tag("x")) == 16
    assert int(scope_tag("x"), 16) >= 0
    assert scope_tag("a") != scope_tag("b")


def test_cache_key_is_frozen_hashable_value() -> None:
    k = key()
    with pytest.raises(AttributeError):
        k.model = "other"  # type: ignore[misc]
    assert {k: 1}[key()] == 1
    assert CacheKey("m", "s", k.digest) != CacheKey("m2", "s", k.digest)
    assert not hasattr(k, "__dict__")
