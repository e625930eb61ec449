"""Counts kept in plain per-process fields on the hot path, handed to prometheus-client in batches.

A prometheus-client update costs a lock and (in multiprocess mode) a write to a memory-mapped
file; a cache hit made half a dozen of them. ``Tally`` adds to a dict instead and ``flush``
turns each distinct series into one ``inc`` (counters), one bucket update (histograms) or one
``set`` of the latest value (gauges that move on every call). The gateway flushes every
``interval_s`` (so other workers' values reach a scrape within it) and right before it renders
``/metrics`` (so the scraped worker's own values are exact).

A request whose updates are all fixed by a few objects (a hot answer: its entries, decision and
tenant) is one ``record``: one dict update keyed by those objects, fanned out into its counters
by the record's ``expand`` at the flush, each amount multiplied by how often it was recorded.

Histogram observations are aggregated into the histogram's own buckets: the flush adds the
bucket counts and the sum through the child's ``_buckets``/``_sum`` values, which is what
``Histogram.observe`` itself does one observation at a time.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Hashable
from typing import Any

from gateway.tasks import stop_task


class Series:
    __slots__ = ("bounds", "buckets", "child", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)
        self.buckets = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        """One observation, as ``Tally.observe`` records it."""
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.buckets):
            self.buckets[i] += 1
        self.total += value


class Tally:
    """Batched counter increments and histogram observations (see the module docstring)."""

    def __init__(self) -> None:
        self._counts: dict[Hashable, list[Any]] = {}  # key -> [child, pending amount]
        self._hists: dict[Hashable, Series] = {}
        self._gauges: dict[Hashable, list[Any]] = {}  # key -> [child, latest value, changed]
        self._records: dict[Hashable, list[Any]] = {}  # key -> [expand, args, times]
        self._before: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None

    def before_flush(self, collect: Callable[[], None]) -> Callable[[], None]:
        """Call ``collect`` at the start of every ``flush`` (it reports what it has gathered
        through this tally); returns what removes it."""
        self._before.append(collect)

        def remove() -> None:
            if collect in self._before:
                self._before.remove(collect)
        return remove

    def inc(self, metric: Any, labels: tuple[str, ...], amount: float = 1.0) -> None:
        key = (id(metric), labels)
        slot = self._counts.get(key)
        if slot is None:
            slot = self._counts[key] = [metric.labels(*labels) if labels else metric, 0.0]
        slot[1] += amount

    def counter(self, metric: Any, labels: tuple[str, ...]) -> list[Any]:
        """The pending slot ``inc`` adds to (``[child, amount]``): a caller that updates one
        series on every request keeps it and adds to ``slot[1]`` itself."""
        key = (id(metric), labels)
        slot = self._counts.get(key)
        if slot is None:
            slot = self._counts[key] = [metric.labels(*labels) if labels else metric, 0.0]
        return slot

    def series(self, metric: Any, labels: tuple[str, ...]) -> Series:
        """The pending buckets ``observe`` adds to (kept by such a caller too: ``add``)."""
        key = (id(metric), labels)
        series = self._hists.get(key)
        if series is None:
            series = self._hists[key] = Series(metric.labels(*labels) if labels else metric)
        return series

    def observe(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        key = (id(metric), labels)
        series = self._hists.get(key)
        if series is None:
            series = self._hists[key] = Series(metric.labels(*labels) if labels else metric)
        i = bisect.bisect_left(series.bounds, value)
        if i < len(series.buckets):
            series.buckets[i] += 1
        series.total += value

    def record(self, key: Hashable, expand: Callable[[Any, int], None], args: Any) -> None:
        """One request whose updates ``expand(args, times)`` makes; ``key`` tells records
        apart (``id`` of the objects in ``args``, which the record holds until the flush)."""
        slot = self._records.get(key)
        if slot is None:
            self._records[key] = [expand, args, 1]
        else:
            slot[2] += 1

    def set(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        """A gauge's latest value; the flush sets it once, however often it moved since."""
        key = (id(metric), labels)
        slot = self._gauges.get(key)
        if slot is None:
            slot = self._gauges[key] = [metric.labels(*labels) if labels else metric, 0.0, True]
        slot[1] = value
        slot[2] = True

    def flush(self) -> None:
        """Hand everything pending to prometheus-client."""
        for collect in self._before:
            collect()
        if self._records:
            records, self._records = self._records, {}
            for expand, args, times in records.values():
                expand(args, times)
        for slot in self._gauges.values():
            if slot[2]:
                slot[0].set(slot[1])
                slot[2] = False
        for slot in self._counts.values():
            if slot[1]:
                slot[0].inc(slot[1])
                slot[1] = 0.0
        for series in self._hists.values():
            if series.total or any(series.buckets):
                for i, n in enumerate(series.buckets):
                    if n:
                        series.child._buckets[i].inc(n)
                        series.buckets[i] = 0
                series.child._sum.inc(series.total)
                series.total = 0.0

    def start(self, interval_s: float) -> None:
        """Flush every ``interval_s`` on the running loop until ``stop``."""
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_s)
                self.flush()

        self._task = asyncio.get_running_loop().create_task(run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        self.flush()
