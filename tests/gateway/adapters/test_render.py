"""Embedding JSON assembled from cached fragments is byte-identical to orjson's whole render."""

from __future__ import annotations

import time

import numpy as np
import orjson

from gateway.adapters.render import FragmentCache
from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey, derive_key
from gateway.pipeline import Outcome
from gateway.pipeline.vectors import vector


def _key(text: str) -> CacheKey:
    return derive_key(route="/v1/embeddings", model="minilm", model_version="1", scope="t",
                      normalization="n", canonical=text.encode())


def _hit(text: str, vec: np.ndarray) -> Outcome:
    entry = Entry(vec.tobytes(), time.time(), 60.0)
    return Outcome(entry.value, entry.meta, "HIT", 0.0, _key(text), entry)


def test_body_matches_a_whole_render() -> None:
    rng = np.random.default_rng(3)
    items = [_hit("a", rng.standard_normal(384).astype(np.float32)),
             Outcome(rng.standard_normal(384).astype(np.float32).tobytes(), b"", "MISS", 0.0)]
    body = FragmentCache().embeddings_body(items, 'model "x"', 12)
    whole = orjson.dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector(it)}
                 for i, it in enumerate(items)],
        "model": 'model "x"', "usage": {"prompt_tokens": 12, "total_tokens": 12},
    }, option=orjson.OPT_SERIALIZE_NUMPY)
    assert body == whole


def test_fragments_are_reused_per_entry_and_bounded() -> None:
    cache = FragmentCache(max_entries=2)
    vec = np.ones(4, dtype=np.float32)
    first = _hit("a", vec)
    assert cache.fragment(first) is cache.fragment(first)
    # Same key, a new entry (refreshed): rendered anew, never the old bytes.
    newer = _hit("a", vec * 2)
    assert orjson.loads(cache.fragment(newer)) == [2.0] * 4
    cache.fragment(_hit("b", vec))
    cache.fragment(_hit("c", vec))
    assert len(cache) == 2


def test_the_same_entry_decoded_again_reuses_its_fragment() -> None:
    """Node-tier and Redis hits decode a new Entry object each time: same bytes, same time."""
    cache = FragmentCache()
    first = _hit("a", np.ones(4, dtype=np.float32))
    stored = first.entry
    assert stored is not None
    again = Entry.decode(stored.encode())
    assert again is not stored
    decoded = Outcome(again.value, again.meta, "HIT", 0.0, first.key, again)
    assert cache.fragment(decoded) is cache.fragment(first)
