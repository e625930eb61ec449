"""The data plane: model lookup, readiness, warm-up and batched inference, apart from transport.

Every protocol adapter (OIP over REST and gRPC, OpenAI) calls ``DataPlane.embed``; it checks
the request's limits, hands the texts to the model's dynamic batcher (whose worker thread
tokenizes and runs them) and converts the batcher's and ONNX Runtime's errors into the
backend's own (``QueueFull`` -> ``Overloaded``, ``DeadlineExpired`` -> ``DeadlineExceeded``,
...).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import backend
from backend.coldstart import ColdStart
from backend.errors import (
    BackendError,
    DeadlineExceeded,
    ModelNotFound,
    Overloaded,
    Unavailable,
)
from backend.limits import RequestLimits
from backend.metrics import BackendMetrics
from backend.model import Embedded, EmbeddingModel
from backend.runtime import InferenceFailed
from backend.scheduling import (
    BatcherClosed,
    DeadlineExpired,
    DynamicBatcher,
    QueueFull,
    SchedulePolicy,
)
from backend.settings import ServeSettings

SERVER_NAME = "edge-backend"
# On a CPU, padded tokens per ONNX Runtime call past which a batch runs as several calls. One
# call over many long texts does more work per text than a few smaller ones (attention grows
# with length squared and leaves the caches); measured on the 2-core reference machine, one
# intra-op thread, texts per CPU-second by batch size: 256 tokens 29.4 at batch 1, 24.8 at 32;
# 128 tokens 62.4 at batch 4, 54.7 at 32; 16 tokens 516.7 at batch 16, 220.1 at batch 1.
# 512 is near the best at every length. GPUs gain from large calls: no cap there.
CPU_CALL_TOKENS = 512
# On a CPU, expected compute past which a batch takes no more items (settings.py).
CPU_BATCH_COMPUTE_MS = 10.0
LOWEST_LEVEL_COMPUTE_MS = 3.0
"""On the CPU, the compute bound of a batch made of the lowest level's texts alone (batch jobs):
about two short texts beyond a call's fixed cost, so an interactive request that arrives while
it computes waits a few milliseconds, not a full batch (issue 23: interactive p99 beside a
batch)."""

log = logging.getLogger("backend.dataplane")


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """Embeddings for one request, in its order, with where the time went."""

    embeddings: npt.NDArray[np.float32]  # [n, dim]
    token_counts: list[int]
    queue_s: float
    compute_s: float
    batch_size: int


class ServedModel:
    """A model as served: the loaded model, its batcher, its readiness and request limits."""

    def __init__(self, model: EmbeddingModel, settings: ServeSettings, metrics: BackendMetrics,
                 *, started_at: float):
        config = model.config
        self.model = model
        self.config = config
        self.ready = False
        queue_size = settings.max_queue_size or config.max_queue_size
        self.max_batch_size = settings.max_batch_size or config.max_batch_size
        self.max_items = min(settings.max_items_per_request, queue_size)
        self.limits = RequestLimits(max_items=self.max_items,
                                    max_text_bytes=settings.max_text_bytes_per_request)
        on_cpu = model.runtime.device == "cpu"
        self.policy = schedule_policy(settings, config.max_queue_delay_ms, queue_size, on_cpu)
        self.batcher: DynamicBatcher[str, Embedded] = DynamicBatcher(
            model.embed,
            max_batch_size=self.max_batch_size,
            policy=self.policy,
            size_of=model.size_of,
            max_call_size=CPU_CALL_TOKENS if on_cpu else None,
            workers=settings.workers,
            express=settings.express_lane,
            nice=settings.compute_nice,
            observer=metrics.observer(config.name),
            name=config.name,
        )
        self.queue_seconds = metrics.queue_seconds.labels(config.name)
        self.cold = ColdStart(config.name, metrics, started_at=started_at)
        if model.load_s is not None:  # None: the caller loaded it (tests share sessions)
            self.cold.loaded(model.load_s)
        metrics.queue_depth.labels(config.name).set_function(lambda: self.batcher.depth)
        for level in range(len(self.policy.levels)):
            metrics.pending.labels(config.name, str(level + 1)).set_function(
                functools.partial(self.batcher.depth_of, level))


def schedule_policy(settings: ServeSettings, config_delay_ms: float, queue_size: int,
                    on_cpu: bool) -> SchedulePolicy:
    """A model's scheduling policy from the settings (``None`` values: the model's config)."""
    delay_ms = settings.max_queue_delay_ms
    budget_ms = settings.max_batch_compute_ms
    if budget_ms is None:
        budget_ms = CPU_BATCH_COMPUTE_MS if on_cpu else 0.0
    shared_ms = settings.shared_batch_compute_ms or 0.0
    per_level = settings.priority_batch_compute_ms
    if per_level is None and on_cpu and settings.priority_levels > 1 and (
            not budget_ms or budget_ms > LOWEST_LEVEL_COMPUTE_MS):
        per_level = (budget_ms,) * (settings.priority_levels - 1) + (LOWEST_LEVEL_COMPUTE_MS,)
    return SchedulePolicy.uniform(
        levels=settings.priority_levels,
        max_queue_size=queue_size,
        default_timeout_s=settings.default_timeout_ms / 1000.0,
        queue_sizes=settings.priority_queue_sizes or (),
        timeouts_s=[t / 1000.0 for t in settings.priority_timeouts_ms or ()],
        batch_compute_s=[t / 1000.0 for t in per_level or ()],
        default_priority=settings.default_priority,
        fair_by=settings.fair_by,
        max_queue_delay_s=(config_delay_ms if delay_ms is None else delay_ms) / 1000.0,
        max_batch_compute_s=budget_ms / 1000.0,
        shared_batch_compute_s=shared_ms / 1000.0,
    )


class DataPlane:
    """Everything the HTTP handlers need, for every served model."""

    def __init__(
        self, models: Sequence[EmbeddingModel], settings: ServeSettings, metrics: BackendMetrics,
        *, started_at: float | None = None,
    ) -> None:
        """``started_at``: ``time.monotonic()`` when the process (or app) started, from which
        the time to the first answer counts; default: now."""
        self.settings = settings
        self.metrics = metrics
        started = time.monotonic() if started_at is None else started_at
        self.models = {m.name: ServedModel(m, settings, metrics, started_at=started)
                       for m in models}
        self._warmup: asyncio.Task[None] | None = None
        for served in self.models.values():
            runtime = served.model.runtime
            metrics.model_info.labels(
                served.config.name, served.config.version, runtime.variant, runtime.provider
            ).set(1)
            metrics.ready.labels(served.config.name).set(0)

    async def start(self) -> None:
        """Starts the batchers and, in the background, the warm-up that makes us ready."""
        for served in self.models.values():
            served.batcher.start()
        self._warmup = asyncio.get_running_loop().create_task(self._warm_up())

    async def close(self) -> None:
        """Stops warming up, fails what is queued (503) and waits for running batches."""
        if self._warmup is not None:
            self._warmup.cancel()
            await asyncio.gather(self._warmup, return_exceptions=True)
        for served in self.models.values():
            served.ready = False
            await served.batcher.close()

    @property
    def ready(self) -> bool:
        """True once every model is warmed up."""
        return all(served.ready for served in self.models.values())

    def server_metadata(self) -> dict[str, Any]:
        """The OIP server metadata object (plus this replica's region and zone, when set)."""
        meta: dict[str, Any] = {"name": SERVER_NAME, "version": backend.__version__,
                                "extensions": []}
        if self.settings.region:
            meta["region"] = self.settings.region
        if self.settings.zone:
            meta["zone"] = self.settings.zone
        return meta

    def cold_starts(self) -> dict[str, Any]:
        """Every model's cold-start figures (``GET /coldstart``)."""
        return {"models": {name: served.cold.snapshot() for name, served in self.models.items()}}

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The served model; ``ModelNotFound`` for an unknown name or version."""
        served = self.models.get(name)
        if served is None:
            raise ModelNotFound(f"unknown model {name!r} (served: {', '.join(self.models)})")
        if version is not None and version != served.config.version:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r} (available: {served.config.version})"
            )
        return served

    async def embed(self, served: ServedModel, texts: Sequence[str], *,
                    deadline: float | None, priority: int = 0, key: str = "",
                    express: bool = False) -> EmbedResult:
        """Embeds ``texts`` through the model's batcher at ``priority`` (0: the model's
        default) for fairness key ``key``; ``deadline`` is ``time.monotonic()`` (None: the
        priority level's default timeout); ``express``: the caller judged the key quiet (the
        express lane may take it, ``scheduling/params.py``).

        A request past the model's limits (``limits.py``) fails before it is tokenized.
        """
        name = served.config.name
        served.limits.check(texts)
        if not served.ready:
            raise Unavailable(f"model {name!r} is not ready (warming up)", retry_after_s=1.0)
        try:
            outcome = await served.batcher.submit(
                texts, timeout_s=None if deadline is None else deadline - time.monotonic(),
                priority=priority, key=key, express=express)
        except QueueFull as exc:
            raise Overloaded(f"model {name!r}: {exc}", retry_after_s=exc.retry_after_s) from None
        except DeadlineExpired as exc:
            raise DeadlineExceeded(f"model {name!r}: {exc}") from None
        except BatcherClosed:
            raise Unavailable("the server is shutting down") from None
        except InferenceFailed as exc:
            log.error("inference failed", extra={"fields": {"model": name, "error": str(exc)}})
            raise BackendError("inference failed") from None
        served.queue_seconds.observe(outcome.queue_s)
        served.cold.answered(outcome.queue_s + outcome.compute_s)
        results = outcome.results
        # One text (the common miss): a view of its row, no copy.
        rows = results[0][0][np.newaxis] if len(results) == 1 else np.stack([r for r, _ in results])
        return EmbedResult(
            embeddings=rows,
            token_counts=[tokens for _, tokens in results],
            queue_s=outcome.queue_s,
            compute_s=outcome.compute_s,
            batch_size=outcome.batch_size,
        )

    async def _warm_up(self) -> None:
        loop = asyncio.get_running_loop()
        for served in self.models.values():
            sizes = self.settings.warmup_batch_sizes or (1, served.max_batch_size)
            fields: dict[str, Any] = {"model": served.config.name,
                                      "lengths": list(self.settings.warmup_lengths),
                                      "batch_sizes": list(sizes)}
            try:
                # Each warm-up call also teaches the scheduler what a batch costs, so that its
                # first estimates (compute bound, deadlines) come from this machine.
                seconds = await loop.run_in_executor(
                    None, served.model.warm_up, self.settings.warmup_lengths, sizes,
                    served.batcher.cost.observe,
                )
            except Exception as exc:
                log.error("warm-up failed; model stays not ready",
                          extra={"fields": {**fields, "error": f"{type(exc).__name__}: {exc}"}})
                continue
            served.cold.warmed(seconds)
            served.ready = True
            self.metrics.ready.labels(served.config.name).set(1)
            log.info("model ready", extra={"fields": {**fields, "warmup_s": round(seconds, 3)}})
