"""Entry: freshness windows, and an encoding that round-trips and refuses anything corrupt."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cache.entry import FORMAT_VERSION, HEADER_SIZE, MAGIC, CacheCorrupt, Entry

finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(
    value=st.binary(max_size=4096), meta=st.binary(max_size=64), created=finite, ttl=finite,
    swr=finite, sie=finite, compute=finite,
)
def test_roundtrip(
    value: bytes, meta: bytes, created: float, ttl: float, swr: float, sie: float, compute: float
) -> None:
    e = Entry(value, created, ttl, swr, sie, compute, meta)
    blob = e.encode()
    assert len(blob) == HEADER_SIZE + len(value) + len(meta)
    assert Entry.decode(blob) == e


SAMPLE = Entry(b"\x01\x02embedding-bytes" * 10, 1_700_000_000.5, 60, 30, 300, 4.2, b"m").encode()


@given(pos=st.integers(0, len(SAMPLE) - 1), flip=st.integers(1, 255))
def test_any_flipped_byte_is_corrupt(pos: int, flip: int) -> None:
    bad = bytearray(SAMPLE)
    bad[pos] ^= flip
    with pytest.raises(CacheCorrupt):
        Entry.decode(bytes(bad))


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"GWCE",
        SAMPLE[:HEADER_SIZE - 1],
        SAMPLE[:-1],
        SAMPLE + b"x",
        b"not an entry at all, just some other application's value" * 2,
        b"XXXX" + SAMPLE[4:],
        MAGIC + bytes([FORMAT_VERSION + 1]) + SAMPLE[5:],
    ],
    ids=["empty", "magic-only", "short-header", "truncated", "extended", "garbage",
         "wrong-magic", "future-version"],
)
def test_corrupt_values_raise(blob: bytes) -> None:
    with pytest.raises(CacheCorrupt):
        Entry.decode(blob)


def test_valid_checksum_but_nonsense_timing_is_corrupt() -> None:
    import xxhash

    rest = struct.pack("<5dII", 0.0, -5.0, 0.0, 0.0, 0.0, 0, 1) + b"v"
    blob = struct.pack("<4sBQ", MAGIC, FORMAT_VERSION, xxhash.xxh3_64_intdigest(rest)) + rest
    with pytest.raises(CacheCorrupt, match="timing"):
        Entry.decode(blob)


def test_windows() -> None:
    e = Entry(b"v", created_at=1000.0, ttl_s=10, stale_while_revalidate_s=5, stale_if_error_s=20)
    assert e.expires_at == 1030.0
    assert e.is_fresh(1000) and e.is_fresh(1009.9)
    assert not e.within_swr(1005) and not e.within_sie(1005)
    assert not e.is_fresh(1010)
    assert e.within_swr(1010) and e.within_swr(1014.9) and not e.within_swr(1015)
    assert e.within_sie(1015) and e.within_sie(1029.9) and not e.within_sie(1030)
    assert e.age(1012.5) == 12.5
    assert e.age(990) == 0.0  # another replica's clock ahead of ours


def test_no_windows_expire_at_ttl() -> None:
    e = Entry(b"v", 0.0, 5)
    assert e.expires_at == 5.0
    assert not e.within_swr(6) and not e.within_sie(6)


def test_repr_never_shows_the_value() -> None:
    e = Entry(b"secret text", 0.0, 1, meta=b"secret meta")
    assert "secret" not in repr(e)
    assert "11 bytes" in repr(e)
