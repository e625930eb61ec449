"""Cache key derivation: pure functions, no I/O.

A key is xxh3_128 over an unambiguous framing of everything that changes the answer: the route,
the model and its version, the scope (a tenant id, or the shared scope), the policy's
normalization fingerprint and the canonical request bytes. Every field is length-prefixed, so
``("ab", "c")`` and ``("a", "bc")`` can never frame to the same bytes.

In Redis a key reads ``{prefix}:{model}:{scope_tag}:{digest hex}``. The model is kept in clear so
an admin can purge one model with ``SCAN MATCH prefix:model:*``; the scope appears only as
``scope_tag`` (16 hex chars of xxh3_64) so tenant ids are never stored in clear, yet one
tenant's entries can still be found with ``prefix:*:{scope_tag}:*``.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import NamedTuple

import xxhash

# Bump the domain tag when the framing changes: every old key then simply stops matching.
_DOMAIN = b"gw-key\x01"
_LEN32 = struct.Struct("<I").pack
_LEN64 = struct.Struct("<Q").pack
_xxh3_128 = xxhash.xxh3_128_digest


class CacheKey(NamedTuple):
    """One cache entry's identity: the 16-byte digest plus the model and scope it belongs to.

    Immutable, slotted (no ``__dict__``) and hashable. A NamedTuple rather than a frozen
    dataclass because it is built once per item and hashed on every L1 lookup: tuple creation
    and hashing run in C, several times faster. The digest alone identifies the entry (model and
    scope are inside it); they are carried along so tiers can purge by them.
    """

    model: str
    scope: str
    digest: bytes

    @property
    def hex(self) -> str:
        """The digest as 32 lowercase hex characters."""
        return self.digest.hex()

    def redis_key(self, prefix: str) -> str:
        """``{prefix}:{model}:{scope_tag}:{digest hex}``."""
        return f"{prefix}:{self.model}:{scope_tag(self.scope)}:{self.digest.hex()}"


@lru_cache(maxsize=65536)
def scope_tag(scope: str) -> str:
    """16 hex characters of xxh3_64 of the scope: names a tenant in Redis without its id."""
    return xxhash.xxh3_64_hexdigest(scope.encode("utf-8"))


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _LEN32(len(raw)) + raw


@lru_cache(maxsize=4096)
def _context(route: str, model: str, model_version: str, scope: str, normalization: str) -> bytes:
    # Everything but the canonical bytes repeats across the items of one request and across
    # requests of one tenant, so its framing is built once and reused.
    return b"".join(
        (_DOMAIN, _field(route), _field(model), _field(model_version), _field(scope),
         _field(normalization))
    )


def derive_key(
    *,
    route: str,
    model: str,
    model_version: str,
    scope: str,
    normalization: str,
    canonical: bytes,
) -> CacheKey:
    """The key of one cacheable item.

    For list inputs call it once per item, with ``canonical`` the item's normalized text bytes
    plus any request options that change the answer (the caller frames those in).
    """
    head = _context(route, model, model_version, scope, normalization)
    digest = _xxh3_128(head + _LEN64(len(canonical)) + canonical)
    return CacheKey(model, scope, digest)
