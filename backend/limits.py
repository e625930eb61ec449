"""What one request may ask of a model, checked before it is tokenized or queued.

A request's cost has two parts. Compute grows with its tokens, and every text is truncated to
the model's ``max_seq_length`` (``tokenizer.py``, as sentence-transformers does), so texts per
request x ``max_seq_length`` bounds it: the text-count limit is the token limit, and a separate
one would either repeat it or refuse what the gateway sends at its own item limit (256 long
texts). Tokenizing and memory grow with the text's bytes, truncation or not (the tokenizer
reads a whole text before it cuts), so the bytes of text are bounded too.

Measured on the 2-core reference machine (fp32, default warm-up), one request at the default
limits, 256 texts x 8 KiB = 2 MiB, took 6-8 s with the machine otherwise idle (17-19 s while
other test runs shared its cores; 256 x 256 tokens, of which tokenizing took 0.35 s) and raised
RSS by 77 MiB (401 -> 478). 256 x 16 KiB, which took 7 s and +149 MiB, is now a 413 in 0.05 s.

Pure functions: no aiohttp, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backend.errors import BadRequest, PayloadTooLarge


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLimits:
    """The most texts and UTF-8 bytes of text one request may carry."""

    max_items: int
    max_text_bytes: int

    def check(self, texts: Sequence[str]) -> None:
        """``BadRequest`` (400) for too many texts, ``PayloadTooLarge`` (413) for too many
        bytes of text; each message names the limit."""
        if len(texts) > self.max_items:
            raise BadRequest(
                f"too many items: {len(texts)} texts; at most {self.max_items} per request"
            )
        size = text_bytes(texts)
        if size > self.max_text_bytes:
            raise PayloadTooLarge(
                f"texts of {size} bytes in all exceed the limit of {self.max_text_bytes} bytes "
                "of text per request (max_text_bytes_per_request)"
            )


def text_bytes(texts: Sequence[str]) -> int:
    """The texts' size in UTF-8 bytes, all together."""
    # An ASCII str knows it is ASCII (no scan): its length is its size, with no copy to encode.
    return sum(len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts)
