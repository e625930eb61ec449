"""Answers of hot requests kept ready: the rendered body of a request that was all cache hits.

A repeat of the very same request (same route, tenant, body bytes and policy-relevant headers)
is answered from here without parsing, policy evaluation, key derivation or rendering — but only
while everything that decided the answer still holds, checked on every use:
- the active policy is the one it was decided under (a reload changes the version);
- the model version the keys were derived for is still the one served;
- every item's entry is still *the same object* in L1 and still fresh, by the stricter of its
  own TTL and the policy's (a purge, eviction,
  refresh or expiry breaks the identity, and the slow path answers and refreshes); an item L1
  no longer holds may instead be the same entry (creation time and value) in the node tier,
  which every worker of the host shares: it is put back into L1 and the answer stands.
Requests with ``Cache-Control``, a shadow policy or ``log_request_text`` always take the full
path. No item the policy forbids to store is ever here: such a request is never all HITs.
Bounded by entries and bytes (least recently used first); in-process memory only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from gateway.cache.entry import Entry
from gateway.cache.keys import CacheKey
from gateway.cache.memory import MemoryCache
from gateway.cache.node import NodeCache
from gateway.cache.tracefile import TraceRecorder
from gateway.pipeline import Result
from gateway.pipeline.accounting import hot_usage
from gateway.policy import Decision, Policy
from gateway.policy.headers import RequestHeaders
from gateway.policy.store import PolicyStore
from gateway.telemetry.observer import Observer
from gateway.telemetry.usage import TenantUsage


@dataclass(frozen=True, slots=True, eq=False)
class HotAnswer:
    """A rendered all-HIT answer and what it depends on; what its answers report (``trail``,
    ``usage``) is worked out once, when it is kept. Compared and hashed by identity (the
    metrics count its answers by it: gateway/telemetry/prometheus.py ``hot_answered``)."""

    body: bytes
    keys: tuple[CacheKey, ...]
    entries: tuple[Entry, ...]
    policy_version: str
    model: str
    model_version: str | None
    decision: Decision
    compute_ms: float
    trail: str
    """``X-Cache-Policy``: the decision's ``rule@version``."""
    usage: TenantUsage
    """What one answer of it uses (gateway/pipeline/accounting.py ``hot_usage``)."""
    created_at: float
    """When its oldest entry was made: the answer's ``Age`` counts from it."""


class HotAnswers:
    """The bounded store of hot answers (see the module docstring)."""

    def __init__(self, *, policies: PolicyStore, l1: MemoryCache,
                 model_version: Callable[[str], str | None], observer: Observer,
                 clock: Callable[[], float], max_entries: int = 4096,
                 max_bytes: int = 32 * 1024 * 1024, enabled: bool = True,
                 node: NodeCache | None = None) -> None:
        self.policies = policies
        self.l1 = l1
        self.node = node
        self.model_version = model_version
        self.observer = observer
        self.clock = clock
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.enabled = enabled
        self._items: OrderedDict[bytes, HotAnswer] = OrderedDict()
        self._bytes = 0
        self._headers_of: tuple[str, tuple[str, ...]] = ("", ())
        self._prefixes: dict[tuple[str, str], bytes] = {}  # (path, tenant) -> key prefix
        #: The trace recorder when ``cache.trace`` is on (set by the app).
        self.recorder: TraceRecorder | None = None

    def __len__(self) -> int:
        return len(self._items)

    def key(self, path: str, tenant: str, headers: RequestHeaders, body: bytes,
            ) -> bytes | None:
        """The request's hot key (``path`` as requested: it may name a model version), or None
        when it must take the full path. The caller sends requests with ``Cache-Control`` (or
        anything else that changes how the cache is used) down the full path.

        ``headers`` is the same reading the policy decides by; every value of every header a
        rule matches on is in the key, in order, so only a request whose policy inputs are
        identical can be answered from the answer its decision made."""
        policies = self.policies
        if not self.enabled or policies.shadow is not None:
            return None
        names = self._header_names(policies.active)
        if not names:  # no rule matches on a header (the usual case): one hash call
            prefix = self._prefixes.get((path, tenant))
            if prefix is None:
                if len(self._prefixes) >= 4096:
                    self._prefixes.clear()
                prefix = self._prefixes[(path, tenant)] = (
                    path.encode("utf-8", "surrogateescape") + b"\0"
                    + tenant.encode("utf-8", "surrogateescape") + b"\0\0")
            return xxhash.xxh3_128_digest(prefix + body)
        h = xxhash.xxh3_128()
        h.update(path.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
        h.update(tenant.encode("utf-8", "surrogateescape"))
        for name in names:
            h.update(b"\0" + name.encode() + b"=")
            for value in headers.values_of(name):  # length-prefixed: no two lists collide
                raw = value.encode("utf-8", "surrogateescape")
                h.update(len(raw).to_bytes(4, "little") + raw)
            h.update(b"\1")
        h.update(b"\0\0")
        h.update(body)
        return h.digest()

    def get(self, key: bytes) -> tuple[HotAnswer, float, int] | None:
        """The answer, its age and how many of its items came back from the node tier, while
        everything it depends on holds; else forgets it."""
        found = self._items.get(key)
        if found is None:
            return None
        now = self.clock()
        l1_get = self.l1.get
        valid = (found.policy_version == self.policies.active.version
                 and found.model_version == self.model_version(found.model))
        lost: list[int] = []
        if valid:
            ttl = found.decision.rule.ttl_s  # the policy's TTL may be shorter than an entry's
            for i, (k, e) in enumerate(zip(found.keys, found.entries, strict=True)):
                if not e.is_fresh(now, ttl):
                    valid = False
                    break
                held = l1_get(k)
                if held is not e:
                    if held is not None:  # replaced (refreshed, rewritten): a different answer
                        valid = False
                        break
                    lost.append(i)
        if valid and lost:
            valid = self._from_node(found, lost)
        if not valid:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        if self.recorder is not None:
            self.recorder.record(found.keys, found.entries)
        return found, max(0.0, now - found.created_at), len(lost)

    def _from_node(self, found: HotAnswer, lost: list[int]) -> bool:
        """Whether the node tier still holds the very entries L1 dropped (same creation time
        and value); they go back into L1, under the objects the answer was made from."""
        if self.node is None:
            return False
        keys = [found.keys[i] for i in lost]
        entries, ok = self.node.lookup(keys)
        if not ok:
            return False
        for i, key, held in zip(lost, keys, entries, strict=True):
            e = found.entries[i]
            if held is None or held.created_at != e.created_at or held.value != e.value:
                return False
            self.l1.set(key, e)
        return True

    def observe(self, answer: HotAnswer, tenant: str, from_node: int = 0) -> None:
        """Count a hot answer exactly as the full path counts an all-HIT answer of ``tenant``:
        lookups, decision, items, compute saved, its usage and its ``ok`` request."""
        self.observer.hot_answered(answer, tenant, from_node)

    def put(self, key: bytes, model: str, result: Result, body: bytes) -> None:
        """Keep an answer the full path gave, when every item was a HIT from L1."""
        outcomes = result.outcomes
        if result.cache_status != "HIT" or not outcomes:
            return
        keys, entries = [], []
        for o in outcomes:
            if o.status != "HIT" or o.key is None or o.entry is None:
                return
            keys.append(o.key)
            entries.append(o.entry)
        decision = result.decision
        answer = HotAnswer(body, tuple(keys), tuple(entries), decision.policy_version,
                           model, self.model_version(model), decision,
                           sum(e.compute_ms for e in entries), decision.trail,
                           hot_usage(entries), min(e.created_at for e in entries))
        self._drop(key)
        self._items[key] = answer
        self._bytes += len(body)
        while self._items and (len(self._items) > self.max_entries
                               or self._bytes > self.max_bytes):
            self._drop(next(iter(self._items)))

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def _drop(self, key: bytes) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.body)

    def _header_names(self, policy: Policy) -> tuple[str, ...]:
        """Request headers any rule of ``policy`` matches on (they decide the answer too)."""
        version, names = self._headers_of
        if version != policy.version:
            found = sorted({name for rule in policy.rules if rule.match.headers
                            for name in rule.match.headers})
            names = tuple(found)
            self._headers_of = (policy.version, names)
        return names
