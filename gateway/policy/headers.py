"""The one reading of a request's headers that every stage shares.

A request's headers are read once, into ``RequestHeaders``: lowercased names, each with *all*
its values in the order they came (a header may be sent more than once), minus the ones the
gateway keeps out of policies (``HIDDEN_HEADERS``: credentials and body framing). The hot-answer
key, policy matching and the cache directives all read this one value, so no stage can see a
different header than another (an earlier version let the hot key read the first of two
``X-Debug`` lines and the policy the last, which let a ``cache: false`` rule be bypassed).

The rule for a header sent more than once (``docs/POLICIES.md``, "Repeated headers"):
- a rule's header condition holds when *any* of the header's values matches it; each field
  line counts as a value, and so does each comma-separated element of a line (proxies merge
  repeated lines into one, comma-joined), so ``X-Debug: 0`` + ``X-Debug: 1`` and
  ``X-Debug: 0, 1`` both meet ``x-debug: "1"``;
- ``Cache-Control`` is read as all its lines joined (RFC 9110 list semantics): ``no-store`` on
  any line counts;
- ``X-Request-Timeout-Ms``: every value must be valid and the smallest (strictest) applies.
Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from gateway.policy.targets import HIDDEN_HEADERS


def candidates(values: Sequence[str]) -> tuple[str, ...]:
    """What a header condition is tested against: each value, and each comma-separated
    element of a value, stripped (see the module docstring)."""
    out: list[str] = []
    for value in values:
        out.append(value.strip())
        if "," in value:
            out.extend(part.strip() for part in value.split(","))
    return tuple(out)


class RequestHeaders(Mapping[str, tuple[str, ...]]):
    """A request's headers, read once: lowercase name -> every value, in order.

    A ``Mapping`` of tuples, so rules, the hot key and the cache directives read the same
    values; hidden headers (credentials, body framing) are never in it.
    """

    __slots__ = ("_values",)

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        values: dict[str, tuple[str, ...]] = {}
        for name, value in pairs:
            low = name.lower()
            if low in HIDDEN_HEADERS:
                continue
            have = values.get(low)
            values[low] = (value,) if have is None else (*have, value)
        self._values = values

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> RequestHeaders:
        """From a multi-valued mapping (aiohttp's ``request.headers``: ``items()`` yields every
        line) or a plain dict."""
        return cls(headers.items())

    def __getitem__(self, name: str) -> tuple[str, ...]:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def values_of(self, name: str) -> tuple[str, ...]:
        """Every value of ``name`` (lowercase), in order; empty when absent."""
        return self._values.get(name, ())

    def joined(self, name: str) -> str | None:
        """All values of a list-valued header joined with ``", "`` (RFC 9110), or None."""
        found = self._values.get(name)
        return None if found is None else ", ".join(found)

    def __repr__(self) -> str:
        # Names only: values may carry what a client considers private.
        return f"RequestHeaders({sorted(self._values)})"
