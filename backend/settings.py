"""Typed, frozen, validated settings for ``python -m backend serve``.

Precedence: command-line flags over ``BACKEND_*`` environment variables over the defaults
below. Batching values left as ``None`` come from each model's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

Device = Literal["auto", "cpu", "cuda", "openvino"]
Variant = Literal["fp32", "int8", "fp16"]
ENV_PREFIX = "BACKEND_"
DEFAULT_GRPC_PORT = 8002


class SettingsError(ValueError):
    """A setting has a value the server cannot run with; the message names it and says why."""


def usable_cores() -> int:
    """CPU cores this process may run on (affinity-aware, so containers are sized right)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """Everything the serving process is configured with; see the field comments."""

    # Model repository folder: one sub-folder per model, each with a config.json.
    models_dir: Path = Path("models")
    host: str = "127.0.0.1"
    port: int = 8001
    # Open Inference Protocol over gRPC (same host): None = 8002 (Triton's default) when that
    # port is free, else REST only with a warning, so that several backends on one machine
    # (tests, benchmarks) still start; 0 = off; a port = that port, or exit 2 if it is taken.
    grpc_port: int | None = None
    # auto: a working GPU if there is one (fp16), else the CPU (the OpenVINO EP where it is
    # installed and faster on the warm-up probe, else ONNX Runtime's CPU EP); cuda: GPU or
    # exit 2; cpu: the CPU EP; openvino: the OpenVINO EP (f32) or exit 2 (backend/openvino.py).
    device: Device = "auto"
    # ONNX Runtime intra-op threads per model session; None = every usable core.
    threads: int | None = None
    # Graph variant; None = fp16 on the GPU, the model's default_variant (fp32) on the CPU.
    variant: Variant | None = None
    # Where this replica runs, reported in server metadata and logs for the gateway's routing.
    region: str = ""
    zone: str = ""
    # Batching overrides; None = the model's config.json value.
    max_batch_size: int | None = None
    # The batch-forming window: when a worker frees up and fewer items wait than a full batch,
    # the oldest may wait this long for company. A request that finds the worker idle and
    # nothing queued is computed at once whatever this says (backend/scheduling/batcher.py).
    max_queue_delay_ms: float | None = None
    # Items waiting per priority level (each level has its own bound; 503 beyond it).
    max_queue_size: int | None = None
    # Scheduling (docs/SCHEDULING.md). Priority levels, 1 the highest (Triton's numbering); a
    # request's priority 0 means default_priority, one past the lowest means the lowest.
    priority_levels: int = 3
    default_priority: int = 2
    # Per level, highest first (a short list repeats its last value): the queue bound in items
    # (None: max_queue_size for every level) and the timeout for requests that bring none
    # (None: default_timeout_ms for every level).
    priority_queue_sizes: tuple[int, ...] | None = None
    priority_timeouts_ms: tuple[float, ...] | None = None
    # What fairness between keys counts: "tokens" (compute; VTC) or "texts".
    fair_by: str = "tokens"
    # Expected compute (learned per token) past which a batch takes no more items, so that a
    # request arriving behind it waits at most about one such batch. None: 10 ms on the CPU
    # (batching gains 1.3-1.8x there, mostly by batch 4-8 of short texts), unbounded on a GPU;
    # 0: unbounded.
    max_batch_compute_ms: float | None = None
    # Per level, highest first (a short list repeats its last): the compute bound of a batch
    # that starts at that level. None: max_batch_compute_ms for every level but, on the CPU,
    # the lowest, which gets LOWEST_LEVEL_COMPUTE_MS: a batch of batch-job texts alone is kept
    # short, because an interactive request arriving behind it waits for all of it.
    priority_batch_compute_ms: tuple[float, ...] | None = None
    # While two or more fairness keys (tenants) have sent within the last second, a batch's
    # compute bound is at most this, so one tenant's request waits behind a shorter batch of
    # another's; a tenant alone keeps the level's bound. Off (None or 0) by default: on the
    # reference CPU 5 ms took a quiet tenant's p50 beside a flood from 23-44 to 17-18 ms but
    # the flood's answers from 0.66-0.86 to 0.73-0.75 of capacity (docs/SCHEDULING.md).
    shared_batch_compute_ms: float | None = None
    # Texts one request may carry (also capped by the model's queue size); 400 beyond it.
    # With texts truncated to the model's max_seq_length (256 tokens for MiniLM), this is also
    # the bound on one request's compute: at most 256 x 256 tokens, so there is no token limit.
    max_items_per_request: int = 256
    # UTF-8 bytes of text one request may carry, all texts together (413 beyond it): bounds
    # tokenizing and memory, which grow with the bytes although the tokens are truncated.
    # 2 MiB is the largest ASCII request of the gateway's default policy (256 x 8192 characters).
    max_text_bytes_per_request: int = 2 * 1024 * 1024
    # Largest request body accepted, in bytes (413 beyond it).
    client_max_size: int = 4 * 1024 * 1024
    # Deadline for requests without an X-Request-Timeout-Ms header.
    default_timeout_ms: float = 30_000.0
    # Warm-up inferences before ready: every token length at every batch size
    # (None = batch 1 and the model's max batch size).
    warmup_lengths: tuple[int, ...] = (8, 64, 256)
    warmup_batch_sizes: tuple[int, ...] | None = None
    # Batches in flight per model. One worker whose ORT session uses every core is fastest on
    # the 2-core reference machine (idle: batch 32 of short texts 53 ms with 2 intra-op
    # threads vs 68 ms with 1; 8 x 256 tokens 300 ms vs 540 ms), and the batcher gathers the
    # next batch while it runs. Spin-waiting is off (see runtime.py).
    workers: int = 1
    # One more worker for what a regular batch in compute would make wait: a request of a key
    # that batch does not hold, at a better level, or at its level when the caller judged it
    # quiet (OIP parameter ``express``), computes beside it (the kernel time-slices the two on
    # a shared core) instead of after it. docs/SCHEDULING.md.
    express_lane: bool = False
    # How many nice steps the regular workers' threads run below the event loop's (Linux, per
    # thread; 0 = the same): the loops' request handling and the express lane go first. With
    # the express lane, only while it is in use (its last batch began within a second).
    compute_nice: int = 0
    # Seconds between NVML samples of the GPU metrics (backend/gpu.py), taken off the event
    # loop; 0 = no GPU metrics. Only the GPUs the models run on are sampled.
    gpu_metrics_interval_s: float = 5.0
    log_level: str = "INFO"
    access_log: bool = True

    def __post_init__(self) -> None:
        _check(self.device in get_args(Device), "device",
               f"{self.device!r} is not auto|cpu|cuda|openvino")
        _check(
            self.variant is None or self.variant in get_args(Variant),
            "variant", f"{self.variant!r} is not fp32|int8|fp16",
        )
        _check(0 < self.port < 65536, "port", f"{self.port} is not a TCP port")
        _check(
            self.grpc_port is None or 0 <= self.grpc_port < 65536, "grpc_port",
            f"{self.grpc_port} is not a TCP port (0 turns gRPC off)",
        )
        _check(self.grpc_port != self.port, "grpc_port", "must differ from port")
        _positive("threads", self.threads)
        _positive("max_batch_size", self.max_batch_size)
        _positive("max_queue_size", self.max_queue_size)
        _positive("max_items_per_request", self.max_items_per_request)
        _positive("max_text_bytes_per_request", self.max_text_bytes_per_request)
        _positive("client_max_size", self.client_max_size)
        _positive("workers", self.workers)
        _check(0 <= self.compute_nice <= 19, "compute_nice", "must be 0..19")
        _check(
            self.max_queue_delay_ms is None or self.max_queue_delay_ms >= 0,
            "max_queue_delay_ms", "must be >= 0",
        )
        _check(self.default_timeout_ms > 0, "default_timeout_ms", "must be > 0")
        _check(self.gpu_metrics_interval_s >= 0, "gpu_metrics_interval_s", "must be >= 0")
        _positive("priority_levels", self.priority_levels)
        _check(1 <= self.default_priority <= self.priority_levels, "default_priority",
               f"must be a level, 1..{self.priority_levels}")
        for size in self.priority_queue_sizes or ():
            _positive("priority_queue_sizes", size)
        _check(all(t > 0 for t in self.priority_timeouts_ms or ()), "priority_timeouts_ms",
               "every timeout must be > 0")
        _check(self.fair_by in ("tokens", "texts"), "fair_by",
               f"{self.fair_by!r} is not tokens|texts")
        _check(self.max_batch_compute_ms is None or self.max_batch_compute_ms >= 0,
               "max_batch_compute_ms", "must be >= 0")
        _check(self.shared_batch_compute_ms is None or self.shared_batch_compute_ms >= 0,
               "shared_batch_compute_ms", "must be >= 0")
        _check(all(t >= 0 for t in self.priority_batch_compute_ms or ()),
               "priority_batch_compute_ms", "every bound must be >= 0")
        _check(
            self.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
            "log_level", f"{self.log_level!r} is not DEBUG|INFO|WARNING|ERROR|CRITICAL",
        )
        _check(
            all(n >= 2 for n in self.warmup_lengths), "warmup_lengths",
            "every length must be >= 2 ([CLS] and [SEP])",
        )
        for size in self.warmup_batch_sizes or ():
            _positive("warmup_batch_sizes", size)

    @property
    def grpc_listen_port(self) -> int:
        """The gRPC port to bind (0: gRPC off)."""
        return DEFAULT_GRPC_PORT if self.grpc_port is None else self.grpc_port

    @property
    def intra_op_threads(self) -> int:
        """Threads per ONNX Runtime session."""
        return self.threads if self.threads is not None else usable_cores()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> ServeSettings:
        """Defaults, then ``BACKEND_<FIELD>`` variables, then ``overrides`` (None = unset)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is not None and raw != "":
                values[field.name] = _coerce(field.name, str(field.type), raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _coerce(name: str, type_name: str, raw: str) -> Any:
    try:
        if name == "models_dir":
            return Path(raw)
        if not raw.isascii():  # int() and float() would read "٣" as 3
            raise ValueError("not ASCII")
        if name in ("warmup_lengths", "warmup_batch_sizes", "priority_queue_sizes"):
            return tuple(int(part) for part in raw.split(",") if part.strip())
        if name in ("priority_timeouts_ms", "priority_batch_compute_ms"):
            return tuple(float(part) for part in raw.split(",") if part.strip())
        if type_name.startswith("bool"):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
    except ValueError as exc:
        raise SettingsError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {exc}") from None
    return raw


def _check(ok: bool, field: str, why: str) -> None:
    if not ok:
        raise SettingsError(f"setting {field}: {why}")


def _positive(field: str, value: int | None) -> None:
    _check(value is None or value >= 1, field, f"must be >= 1, got {value}")
