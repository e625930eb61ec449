"""An adaptive concurrency limit per tier: the gradient controller of Envoy's filter.

The limit follows the latency the tier's backends show, so the gateway needs no hand-tuned
``tier_concurrency`` to stop queueing inside the backends:

- **minRTT**: the ideal latency, measured in a *probe window*: the limit drops to ``min_limit``
  and the ``percentile`` of the next ``probe_requests`` calls (granted inside the window) is
  the new minRTT; then the limit from before the window comes back. A probe runs at start, every
  ``probe_interval_s`` (plus up to 10% random jitter, so replicas do not probe in step), and
  after five windows in a row that ended at ``min_limit`` (the old minRTT may be stale), and
  after three windows in a row whose latency was under half minRTT (it was measured on slower
  calls: long texts, a slow spell; the gradient would otherwise hold the limit at its ceiling).
- **sampleRTT**: the ``percentile`` of the calls that finished in the last ``window_s``.
- Each window: ``gradient = minRTT x (1 + buffer) / sampleRTT``, clamped to [0.5, 2];
  ``limit = gradient x limit + sqrt(gradient x limit)`` (the square root is headroom for bursts),
  clamped to [``min_limit``, ``max_limit``] (``max_limit`` is ``tier_concurrency``).

When latency rises above minRTT plus the buffer (the backend queues), the limit falls; while it
stays near minRTT the limit grows by about its square root per window, but only in a window
whose peak in-flight count reached half the limit. A limit the traffic never used says nothing
about what the backends can take (the same check as TCP's congestion-window validation, RFC
7661); Envoy's filter lets it grow, so a quiet spell left the limit at its ceiling when a burst
arrived, and the burst went to the backends' queues until a few windows brought it down.

A rise also needs calls that ran at the limit as it is: at least half of the window's samples
from calls granted since the last rise. A window is shorter than a call when the backend
queues (17 calls at ~8 ms each on one core), so without this the fast answers of calls granted
before a rise doubled the limit again before any call granted at the new one had finished:
under a flood the limit went 5 -> 9 -> 17 -> 27 in 0.6 s, then took the backend's queue of 27
calls to come down, and a quiet tenant's calls waited in the gateway behind them (TCP's slow
start grows at most once per round trip for the same reason).

Pure bookkeeping, no I/O, no timers: it advances as samples arrive, on the caller's clock.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from gateway import validation as check

_GRADIENT_MIN, _GRADIENT_MAX = 0.5, 2.0
_JITTER = 0.1  # probe start delayed by up to this share of the interval
_MIN_WINDOWS_BEFORE_PROBE = 5
_STALE_WINDOWS_BEFORE_PROBE = 3  # windows in a row under half minRTT that start a probe
_STALE_FACTOR = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class AdaptiveSettings:
    """The gradient controller's knobs (settings section ``admission.adaptive``; Envoy's names in
    brackets). On unless ``enabled`` is false; ``admission.tier_concurrency`` is its ceiling."""

    enabled: bool = True
    """Let each tier's limit follow backend latency instead of the fixed
    ``admission.tier_concurrency``."""
    window_s: float = 0.1
    """How often the limit is recomputed [concurrency_update_interval]."""
    percentile: float = 50.0
    """Which percentile of a window's latencies stands for it, and for minRTT
    [sample_aggregate_percentile]."""
    buffer: float = 0.25
    """Latency above minRTT tolerated before the limit falls, as a share of minRTT
    [min_rtt_calc_params.buffer]."""
    min_limit: int = 2
    """The limit during a probe window and the floor at all times
    [min_rtt_calc_params.min_concurrency, 3 in Envoy]; capped at ``admission.tier_concurrency``.
    2: one call computing and one ready behind it, so a backend that computes one call at a time
    (short texts on a CPU) never idles for the hop, and minRTT is measured with at most one call
    queued in it; at 3 minRTT held two calls' wait and the limit settled at 4-6 calls, 3-5 of
    them waiting inside the backend. At 2 what is admitted under overload waits ~40% less, for
    ~10% of closed-loop capacity where batches of two would have formed; 3 gives that back
    (bench/RESULTS.md, "Scheduling: a quiet key's tie with a flood, the limit's rises, the
    adaptive limit's floor", item 3)."""
    probe_interval_s: float = 30.0
    """Time between minRTT probes, plus up to 10% jitter [min_rtt_calc_params.interval]."""
    probe_requests: int = 50
    """Calls a probe measures [min_rtt_calc_params.request_count]."""

    def __post_init__(self) -> None:
        check.boolean("enabled", self.enabled)
        check.positive("window_s", self.window_s)
        check.between("percentile", self.percentile, 0, 100, open_low=True)
        check.between("buffer", self.buffer, 0, 10)
        check.at_least("min_limit", self.min_limit, 1)
        check.positive("probe_interval_s", self.probe_interval_s)
        check.at_least("probe_requests", self.probe_requests, 1)


class GradientLimit:
    """One tier's adaptive limit. ``limit`` is read on every admission decision; call
    ``granted()`` when a call starts (it returns the epoch to hand back) and ``observe()`` with
    that epoch and the call's latency when it ends."""

    __slots__ = (
        "_clock",
        "_deferred",
        "_epoch",
        "_fresh",
        "_min_windows",
        "_next_probe",
        "_peak",
        "_raised_at",
        "_rng",
        "_samples",
        "_settings",
        "_stale_windows",
        "_window_end",
        "limit",
        "max_limit",
        "min_rtt_s",
        "probing",
        "sample_rtt_s",
    )

    def __init__(self, settings: AdaptiveSettings, max_limit: int, *,
                 clock: Callable[[], float], rng: random.Random | None = None) -> None:
        # A floor above the ceiling (tier_concurrency set below min_limit) is capped at it.
        if settings.min_limit > max_limit:
            settings = dataclasses.replace(settings, min_limit=max_limit)
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self.max_limit = max_limit
        self.limit = settings.min_limit
        self.min_rtt_s = 0.0  # 0 until the first probe has finished
        self.sample_rtt_s = 0.0
        self.probing = True
        self._deferred = settings.min_limit  # the limit to restore after a probe
        self._epoch = 0  # bumped at each regime change; samples from older calls are dropped
        self._samples: list[float] = []
        self._window_end = 0.0
        self._next_probe = math.inf
        self._min_windows = 0
        self._stale_windows = 0
        self._peak = 0  # most calls in flight at once in this window
        self._raised_at = -math.inf  # when the limit last rose
        self._fresh = 0  # this window's samples from calls granted since then

    def granted(self, inflight: int = 0) -> int:
        """The epoch a call granted now belongs to; ``inflight`` counts the tier's calls in
        flight with this one."""
        if inflight > self._peak:
            self._peak = inflight
        return self._epoch

    def observe(self, latency_s: float, epoch: int) -> None:
        """Feeds one finished call; may move the limit."""
        now = self._clock()
        if self.probing:
            if epoch != self._epoch:
                return  # started before the probe, at a higher concurrency
            self._samples.append(latency_s)
            if len(self._samples) >= self._settings.probe_requests:
                self._end_probe(now)
            return
        self._samples.append(latency_s)
        if now - latency_s >= self._raised_at:
            self._fresh += 1
        if now >= self._next_probe:
            self._start_probe()
        elif now >= self._window_end:
            self._update(now)

    def _start_probe(self) -> None:
        self._deferred = self.limit
        self.limit = self._settings.min_limit
        self.probing = True
        self._samples.clear()
        self._fresh = 0
        self._epoch += 1

    def _end_probe(self, now: float) -> None:
        self.min_rtt_s = _percentile(self._samples, self._settings.percentile)
        self._samples.clear()
        self.probing = False
        if self._deferred > self.limit:
            self._raised_at = now  # the probe's calls ran at the floor
        self.limit = self._deferred
        self._fresh = 0
        self._min_windows = 0
        self._epoch += 1
        self._window_end = now + self._settings.window_s
        interval = self._settings.probe_interval_s
        self._next_probe = now + interval * (1.0 + _JITTER * self._rng.random())

    def _update(self, now: float) -> None:
        self._window_end = now + self._settings.window_s
        self.sample_rtt_s = _percentile(self._samples, self._settings.percentile)
        samples, fresh = len(self._samples), self._fresh
        self._samples.clear()
        self._fresh = 0
        if self.sample_rtt_s <= 0.0:
            return
        # Calls far faster than minRTT: it was measured on slower work (long texts, a slow
        # spell), so the gradient would hold the limit at its ceiling and the queue would form
        # in the backend again. Measure it anew.
        if self.sample_rtt_s < _STALE_FACTOR * self.min_rtt_s:
            self._stale_windows += 1
            if self._stale_windows >= _STALE_WINDOWS_BEFORE_PROBE:
                self._stale_windows = 0
                self._start_probe()
                return
        else:
            self._stale_windows = 0
        target = self.min_rtt_s * (1.0 + self._settings.buffer)
        gradient = min(_GRADIENT_MAX, max(_GRADIENT_MIN, target / self.sample_rtt_s))
        scaled = gradient * self.limit
        new = int(scaled + math.sqrt(scaled))
        used = self._peak * 2 >= self.limit
        self._peak = 0
        if new > self.limit and not used:
            new = self.limit  # app-limited window: no evidence for a higher limit
        if new > self.limit and fresh * 2 < samples:
            new = self.limit  # answers of calls granted before the last rise: not yet evidence
        new = max(self._settings.min_limit, min(self.max_limit, new))
        if new > self.limit:
            self._raised_at = now
        self.limit = new
        if self.limit == self._settings.min_limit:
            self._min_windows += 1
            if self._min_windows >= _MIN_WINDOWS_BEFORE_PROBE:
                self._start_probe()
        else:
            self._min_windows = 0


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]
