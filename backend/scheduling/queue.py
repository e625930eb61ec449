"""The queue of one model: priority levels, fair between keys inside each, with deadlines.

Pure: no event loop, no threads, no clock of its own; every call that needs the time takes
``now``. The batcher (``batcher.py``) owns the futures and the workers around it.

- Levels are served strictly in order: a batch takes from priority 1 first and fills the room
  left from the next levels.
- Inside a level each fairness key has its own FIFO, and the next item comes from the key that
  has been served least, counted in tokens or texts (VTC, "Fairness in Serving Large Language
  Models", OSDI'24). A key that starts waiting is lifted to the least count of those already
  waiting, so an idle spell earns no credit to burst with later; counts are kept only for
  waiting keys, so memory follows the queue, not the number of keys ever seen. Between keys
  at the same count, the one with fewer tokens waiting goes first (then the older item): a
  quiet key just lifted to a flood's count is served next, not after one more of the flood's
  items, which in batches of one (short texts on a CPU) was a whole batch more to wait.
- Deadlines: every request has one. ``expired(now)`` hands back those past it; ``take`` drops
  a request that could not finish even alone, and stops a batch before the item whose cost
  would carry the batch past the tightest deadline in it, or past the compute bound (what the
  batch adds beyond one call's fixed cost, so a slow call alone does not stop batching).
- Removing a request (done, cancelled, expired) is O(1): its slots stay in their FIFOs marked
  closed and are skipped when they come up; the counts are corrected at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from backend.scheduling.cost import CostModel
from backend.scheduling.policy import SchedulePolicy


class Ticket:
    """One request in the queue, and what the batcher gathers for it on the way out."""

    __slots__ = ("batch_size", "closed", "compute_s", "deadline", "enqueued", "express",
                 "future", "key", "level", "queued", "queued_tokens", "remaining", "results",
                 "seq")

    def __init__(self, n: int, *, level: int, key: str, deadline: float, enqueued: float,
                 seq: int, future: Any = None, express: bool = False) -> None:
        self.future = future
        self.results: list[Any] = [None] * n
        self.remaining = n  # results still to come
        self.queued = 0  # items still in the queue
        self.queued_tokens = 0
        self.level = level
        self.key = key
        self.deadline = deadline
        self.enqueued = enqueued
        self.seq = seq
        self.express = express  # the caller judged its key quiet: the express lane may take it
        self.closed = False
        self.compute_s = 0.0
        self.batch_size = 0


@dataclass(slots=True, eq=False)  # identity, not field, equality: items may be arrays
class Slot:
    """One item of a request, in its key's FIFO."""

    req: Ticket
    index: int  # position in the request
    item: Any
    size: int  # tokens (estimated)
    seq: int  # arrival order across requests


class FairLevel:
    """One priority level: a FIFO per fairness key, served least-counted key first."""

    def __init__(self, by_tokens: bool) -> None:
        self._by_tokens = by_tokens
        self._fifos: dict[str, deque[Slot]] = {}
        self._count: dict[str, float] = {}  # served so far, for waiting keys only
        self._tokens: dict[str, int] = {}  # tokens waiting per key
        self.items = 0
        self.tokens = 0

    def push(self, key: str, slots: Sequence[Slot]) -> None:
        fifo = self._fifos.get(key)
        if fifo is None:
            floor = min(self._count.values(), default=0.0)
            self._count[key] = max(self._count.get(key, 0.0), floor)
            fifo = self._fifos[key] = deque()
        fifo.extend(slots)
        tokens = sum(slot.size for slot in slots)
        self._tokens[key] = self._tokens.get(key, 0) + tokens
        self.items += len(slots)
        self.tokens += tokens

    def head(self, exclude: frozenset[str] = frozenset(), express_only: bool = False
             ) -> Slot | None:
        """The next item fairness picks (not removed), from a key not in ``exclude``; with
        ``express_only``, from a request its caller judged quiet (``Ticket.express``)."""
        best: Slot | None = None
        best_rank = (0.0, 0, 0)
        for key in list(self._fifos):
            fifo = self._fifos[key]
            while fifo and fifo[0].req.closed:
                fifo.popleft()
            if not fifo:
                self._forget(key)
                continue
            if key in exclude or (express_only and not fifo[0].req.express):
                continue
            rank = (self._count[key], self._tokens[key], fifo[0].seq)
            if best is None or rank < best_rank:
                best, best_rank = fifo[0], rank
        return best

    def pop(self, slot: Slot) -> None:
        """Takes ``slot``, the current ``head()``, into a batch."""
        key = slot.req.key
        self._fifos[key].popleft()
        self._count[key] += slot.size if self._by_tokens else 1
        self._tokens[key] -= slot.size
        self.items -= 1
        self.tokens -= slot.size
        if not self._fifos[key]:
            self._forget(key)

    def discount(self, req: Ticket) -> None:
        """Corrects the counts for a closed request's slots still in the FIFO."""
        self.items -= req.queued
        self.tokens -= req.queued_tokens
        if req.key in self._tokens:
            self._tokens[req.key] -= req.queued_tokens

    def tokens_before(self, key: str, tokens: int) -> int:
        """Tokens this level serves before ``tokens`` more from ``key`` are done, at fair
        shares: every other key's waiting tokens up to what ``key`` will have waiting."""
        own = self._tokens.get(key, 0) + tokens
        return sum(min(t, own) for k, t in self._tokens.items() if k != key) + own

    def _forget(self, key: str) -> None:
        del self._fifos[key]
        self._count.pop(key, None)
        self._tokens.pop(key, None)


class ScheduleQueue:
    """Every level of one model's queue; see the module doc."""

    def __init__(self, policy: SchedulePolicy) -> None:
        self.policy = policy
        self.by_tokens = policy.fair_by == "tokens"  # fairness counts tokens, else texts
        self.levels = [FairLevel(self.by_tokens) for _ in policy.levels]
        self._deadlines: list[tuple[float, int, Ticket]] = []
        self._arrivals: deque[Ticket] = deque()  # oldest first, closed ones skipped
        self._seq = itertools.count()
        # Items waiting, every level together: kept as they come and go (read per request).
        self.depth = 0
        # Fairness keys by when each last pushed, oldest first: the shared bound's count, kept
        # only while that bound is set (``active_keys`` is its one reader, and forgets keys
        # past the window only when it reads).
        self._seen: OrderedDict[str, float] | None = (
            OrderedDict() if policy.shared_batch_compute_s else None)

    @property
    def tokens(self) -> int:
        """Tokens waiting, every level together."""
        return sum(level.tokens for level in self.levels)

    def push(self, req: Ticket, items: Sequence[Any], size_of: Callable[[Any], int]) -> None:
        """Queues ``req``'s items (its level's room was checked by the caller)."""
        slots = [Slot(req, i, item, size_of(item), next(self._seq)) for i, item in enumerate(items)]
        req.queued = len(slots)
        req.queued_tokens = sum(slot.size for slot in slots)
        self.levels[req.level].push(req.key, slots)
        self.depth += len(slots)
        heapq.heappush(self._deadlines, (req.deadline, req.seq, req))
        self._arrivals.append(req)
        seen = self._seen
        if seen is not None:
            seen[req.key] = req.enqueued
            seen.move_to_end(req.key)

    def remove(self, req: Ticket) -> None:
        """Takes what is left of ``req`` out of the queue (its other results may be running)."""
        if req.closed:
            return
        req.closed = True
        self.levels[req.level].discount(req)
        self.depth -= req.queued
        req.queued = req.queued_tokens = 0

    def expired(self, now: float) -> list[Ticket]:
        """Removes and returns the requests whose deadline is ``now`` or earlier."""
        gone: list[Ticket] = []
        heap = self._deadlines
        # Requests already closed or wholly in batches leave the heap whenever they surface.
        while heap and (heap[0][2].closed or heap[0][2].queued == 0 or heap[0][0] <= now):
            _, _, req = heapq.heappop(heap)
            if not req.closed and req.queued:
                self.remove(req)
                gone.append(req)
        return gone

    def drain(self) -> list[Ticket]:
        """Removes and returns every request with items still waiting (shutting down)."""
        left = [req for req in self._arrivals if not req.closed and req.queued]
        for req in left:
            self.remove(req)
        self._arrivals.clear()
        return left

    def oldest_enqueued(self) -> float | None:
        """When the oldest request still waiting arrived."""
        arrivals = self._arrivals
        while arrivals and (arrivals[0].closed or arrivals[0].queued == 0):
            arrivals.popleft()
        return arrivals[0].enqueued if arrivals else None

    def tokens_ahead(self, level: int, key: str, tokens: int) -> int:
        """Tokens served before a new request of ``tokens`` at ``level`` from ``key`` is done:
        all of the higher levels, and its fair share of its own."""
        higher = sum(lv.tokens for lv in self.levels[:level])
        return higher + self.levels[level].tokens_before(key, tokens)

    def active_keys(self, now: float) -> int:
        """Fairness keys that pushed within the last ``policy.active_window_s`` (0 without a
        shared bound: none are kept)."""
        seen = self._seen
        if seen is None:
            return 0
        horizon = now - self.policy.active_window_s
        while seen:
            key, when = next(iter(seen.items()))
            if when >= horizon:
                break
            del seen[key]
        return len(seen)

    def take(self, now: float, max_items: int, cost: CostModel, *, below: int | None = None,
             exclude: frozenset[str] = frozenset()) -> tuple[list[Slot], list[Ticket]]:
        """The next batch (at most ``max_items``) and the requests dropped on the way because
        they could not finish before their deadline even alone (removed, to be failed).

        With ``below`` (the batcher's express lane): only from the levels above that 0-based
        level, and from that level itself the requests judged quiet by their caller
        (``Ticket.express``) of keys not in ``exclude``."""
        batch: list[Slot] = []
        dropped: list[Ticket] = []
        tokens = 0
        tightest = float("inf")
        budget = -1.0  # the bound of the level the batch starts at (policy.budget_of)
        shared = self.policy.shared_batch_compute_s
        if shared and self.active_keys(now) < 2:
            shared = 0.0
        for index, level in enumerate(self.levels):
            if below is not None and index > below:
                break
            at_below = index == below
            skip = exclude if at_below else frozenset()
            while len(batch) < max_items:
                slot = level.head(skip, at_below)
                if slot is None:
                    break
                req = slot.req
                if now + cost.estimate(slot.size) > req.deadline:
                    self.remove(req)
                    dropped.append(req)
                    continue
                if budget < 0:
                    budget = self.policy.budget_of(index)
                    if shared and (not budget or budget > shared):
                        budget = shared  # several keys sending: shorter batches
                expected = cost.estimate(tokens + slot.size)
                if batch and (now + expected > min(tightest, req.deadline)
                              or (budget and expected - cost.overhead_s > budget)):
                    return batch, dropped
                level.pop(slot)
                self.depth -= 1
                req.queued -= 1
                req.queued_tokens -= slot.size
                batch.append(slot)
                tokens += slot.size
                tightest = min(tightest, req.deadline)
        return batch, dropped
