"""Rendering embeddings to JSON, with the JSON of hot cache entries kept ready.

Formatting 384 float32 values is the largest single cost of a cache hit (11-14% of its CPU,
bench/RESULTS.md). A hit answers from the same stored entry every time, so its JSON fragment
is kept beside it, keyed by cache key and checked by the entry's creation time and value: a
refreshed or replaced entry is rendered anew, while the same entry decoded again from the node
tier or Redis (a new object each time) reuses the fragment. The fragment is exactly what
``orjson`` writes for the vector, so an answer assembled from fragments is byte-identical to one
rendered whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import orjson

from gateway.cache.keys import CacheKey
from gateway.pipeline import Outcome
from gateway.pipeline.vectors import vector

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


class FragmentCache:
    """A bounded LRU of rendered embedding JSON, for items answered from the cache."""

    def __init__(self, max_entries: int = 8192) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[CacheKey, tuple[float, bytes, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def fragment(self, item: Outcome) -> bytes:
        if item.entry is None or item.key is None:
            return orjson.dumps(vector(item), option=_NUMPY)
        entry = item.entry
        found = self._items.get(item.key)
        if found is not None and found[0] == entry.created_at and found[1] == entry.value:
            self._items.move_to_end(item.key)
            return found[2]
        rendered = orjson.dumps(vector(item), option=_NUMPY)
        self._items[item.key] = (entry.created_at, entry.value, rendered)
        if len(self._items) > self.max_entries:
            self._items.popitem(last=False)
        return rendered

    def embeddings_body(self, items: Sequence[Outcome], model: str, tokens: int) -> bytes:
        """The OpenAI ``/v1/embeddings`` float answer, assembled from fragments."""
        rows = b",".join(
            b'{"object":"embedding","index":%d,"embedding":%s}' % (i, self.fragment(item))
            for i, item in enumerate(items)
        )
        return (b'{"object":"list","data":[' + rows + b'],"model":' + orjson.dumps(model)
                + b',"usage":{"prompt_tokens":%d,"total_tokens":%d}}' % (tokens, tokens))
