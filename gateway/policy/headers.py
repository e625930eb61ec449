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
from typing import Protocol

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


class MultiHeaders(Protocol):
    """A multi-valued, case-insensitive header mapping (aiohttp's ``request.headers``)."""

    def getall(self, key: str, default: Sequence[str], /) -> Sequence[str]: ...

    def items(self) -> Iterable[tuple[str, str]]: ...

    def __contains__(self, key: object, /) -> bool: ...


class RequestHeaders(Mapping[str, tuple[str, ...]]):
    """A request's headers, read once: lowercase name -> every value, in order.

    A ``Mapping`` of tuples, so rules, the hot key and the cache directives read the same
    values; hidden headers (credentials, body framing) are never in it. Made from a request's
    multi-valued headers it reads a name only when asked (the hot path asks for few).
    """

    __slots__ = ("_source", "_values")

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        values: dict[str, tuple[str, ...]] = {}
        for name, value in pairs:
            low = name.lower()
            if low in HIDDEN_HEADERS:
                continue
            have = values.get(low)
            values[low] = (value,) if have is None else (*have, value)
        self._values: dict[str, tuple[str, ...]] | None = values
        self._source: MultiHeaders | None = None

    @classmethod
    def of(cls, headers: MultiHeaders) -> RequestHeaders:
        """A request's headers (aiohttp's ``request.headers``), read name by name on demand."""
        made = object.__new__(cls)  # __init__'s empty dict is not needed: made per request
        made._values, made._source = None, headers
        return made

    def _all(self) -> dict[str, tuple[str, ...]]:
        if self._values is None:
            assert self._source is not None
            self._values = RequestHeaders(self._source.items())._all()
        return self._values

    def values_of(self, name: str) -> tuple[str, ...]:
        """Every value of ``name`` (lowercase), in order; empty when absent."""
        if self._values is not None:
            return self._values.get(name, ())
        if name in HIDDEN_HEADERS:
            return ()
        assert self._source is not None
        return tuple(self._source.getall(name, ()))

    def __getitem__(self, name: str) -> tuple[str, ...]:
        found = self.values_of(name)
        if not found:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self._source is not None:  # no tuple made: the hot path asks this of every request
            return name not in HIDDEN_HEADERS and name in self._source
        return bool(self.values_of(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def joined(self, name: str) -> str | None:
        """All values of a list-valued header joined with ``", "`` (RFC 9110), or None."""
        found = self.values_of(name)
        return ", ".join(found) if found else None

    def __repr__(self) -> str:
        # Names only: values may carry what a client considers private.
        return f"RequestHeaders({sorted(self._all())})"
