"""The sections of ``python -m bench gpu_check`` (see ``bench/gpu_check.py``), in run order.

Each takes the shared ``Context`` and returns the lines to print, or raises ``Skip`` with the
reason it cannot run here. Sessions made by one section are kept on the context for the next.
"""

from __future__ import annotations

import importlib
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import orjson

from backend.model import EmbeddingModel
from backend.repository import ModelConfig, load_repository
from backend.runtime import (
    ModelRuntime,
    _provider_load_error,
    _session,
    _tensorrt_options,
    probe_gpu,
)
from backend.tokenizer import TextTokenizer
from bench.gpu_carry import ROOT, upcast

REFERENCE = ROOT / "tests" / "fixtures" / "minilm_reference.json"
SHORT = "How do I reset my password?"
LONG = "the quick brown fox jumps over the lazy dog " * 40


class Skip(Exception):
    """This section cannot run here; the message says why."""


@dataclass
class Context:
    models_dir: Path
    deadline: float
    quick: bool = False
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-check-")))
    cpu: EmbeddingModel | None = None  # the built fp32 graph on the CPU EP
    cuda: EmbeddingModel | None = None  # the fp16 graph on the CUDA EP

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def config(self) -> ModelConfig:
        (config,) = load_repository(self.models_dir)
        return config

    def model(self, path: Path, providers: list[Any], variant: str) -> EmbeddingModel:
        config = self.config()
        tokenizer = TextTokenizer.from_file(config.tokenizer_path,
                                            max_length=config.max_seq_length)
        return EmbeddingModel(config, tokenizer,
                              ModelRuntime(_session(path, providers, 4), config, variant))


def cosines(a: Any, b: Any) -> Any:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def reference() -> tuple[list[str], Any]:
    items = orjson.loads(REFERENCE.read_bytes())["items"]
    return [i["text"] for i in items], np.asarray([i["embedding"] for i in items])


def embed(model: EmbeddingModel, texts: list[str]) -> Any:
    return np.stack([row for row, _ in model.embed(texts)])


def providers_and_gpus(ctx: Context) -> list[str]:
    ort.set_default_logger_severity(3)  # errors only: each section says what failed
    lines = [f"onnxruntime {ort.__version__}: {ort.get_available_providers()}"]
    try:
        import pynvml

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            lines.append(f"NVML GPU {i}: {pynvml.nvmlDeviceGetName(h)}, {memory:.0f} GiB")
        pynvml.nvmlShutdown()
    except Exception as exc:  # no binding, no driver: said, not fatal
        lines.append(f"NVML: {type(exc).__name__}: {exc}")
    return lines


def fp32_from_fp16(ctx: Context) -> list[str]:
    config = ctx.config()
    fp16 = config.variant_path("fp16")
    started = time.perf_counter()
    path = ctx.scratch / "model.fp32-from-fp16.onnx"
    onnx.save(upcast(onnx.load(str(fp16))), str(path))
    ctx.cpu = ctx.model(path, ["CPUExecutionProvider"], "fp32")
    texts, expected = reference()
    got = cosines(embed(ctx.cpu, texts), expected)
    return [f"built {path.name} in {time.perf_counter() - started:.1f} s; CPU EP cosine vs the "
            f"reference (sentence-transformers fp32): min {got.min():.6f}"]


def cuda_fp16(ctx: Context) -> list[str]:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"this onnxruntime ({ort.__version__}) has no CUDA provider: the GPU build "
                   "(onnxruntime-gpu) is needed, and its wheel is over the 64 MiB a run carries")
    why = probe_gpu()  # the backend's own probe: says which library is missing
    if why is not None:
        raise Skip(why)
    started = time.perf_counter()
    model = ctx.model(ctx.config().variant_path("fp16"),
                      [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"],
                      "fp16")
    if model.runtime.provider != "CUDAExecutionProvider":
        raise Skip(f"ONNX Runtime placed the model on {model.runtime.providers}")
    ctx.cuda = model
    texts, expected = reference()
    rows = embed(model, texts)
    lines = [f"session on {model.runtime.providers} in {time.perf_counter() - started:.1f} s",
             f"fp16 (GPU) vs reference: min cosine {cosines(rows, expected).min():.6f}"]
    if ctx.cpu is not None:
        lines.append(f"fp16 (GPU) vs fp32 built here (CPU EP): min cosine "
                     f"{cosines(rows, embed(ctx.cpu, texts)).min():.6f}")
    return lines


def _timings(model: EmbeddingModel, text: str, rounds: int) -> tuple[float, float, int, float]:
    (seq,) = model.tokenize([text])
    model.compute([seq])
    one = []
    for _ in range(rounds):
        started = time.perf_counter()
        model.compute([seq])
        one.append(time.perf_counter() - started)
    best = (1, 0.0)
    for batch in (1, 8, 32, 64):
        model.compute([seq] * batch)
        started = time.perf_counter()
        for _ in range(3):
            model.compute([seq] * batch)
        rate = 3 * batch / (time.perf_counter() - started)
        best = max(best, (batch, rate), key=lambda b: b[1])
    return (float(np.percentile(one, 50)) * 1000, float(np.percentile(one, 99)) * 1000,
            best[0], best[1])


def latency(ctx: Context) -> list[str]:
    if ctx.cuda is None:
        raise Skip("no CUDA session (see the CUDA EP section)")
    rounds = 20 if ctx.quick else 200
    lines = ["| provider | texts | p50 batch 1 (ms) | p99 batch 1 (ms) | best batch | texts/s |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, model in (("CUDA fp16", ctx.cuda), ("CPU fp32", ctx.cpu)):
        for label, text in (("short", SHORT), ("long", LONG)):
            if model is None:
                continue
            p50, p99, batch, rate = _timings(model, text, rounds)
            lines.append(f"| {name} | {label} | {p50:.2f} | {p99:.2f} | {batch} | {rate:.0f} |")
    return lines


def gpu_metrics_under_load(ctx: Context) -> list[str]:
    from backend.gpu import GpuMonitor, nvml_devices

    monitor, reason = GpuMonitor.open(nvml_devices([0]))
    if monitor is None:
        raise Skip(reason)
    load = _gpu_load(ctx)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            load()

    worker = threading.Thread(target=busy)
    idle = monitor.sample()[0]
    worker.start()
    peak = idle
    try:
        for _ in range(10):
            time.sleep(0.5)
            sample = monitor.sample()[0]
            peak = max(peak, sample, key=lambda s: s.utilization_ratio)
    finally:
        stop.set()
        worker.join()
        monitor.close()
    if peak.utilization_ratio <= 0:
        raise RuntimeError(f"utilisation stayed 0 under load: {peak}")
    return [f"idle: {idle}", f"under load (peak utilisation): {peak}"]


def _gpu_load(ctx: Context) -> Callable[[], object]:
    if ctx.cuda is not None:
        cuda = ctx.cuda
        (seq,) = cuda.tokenize([LONG])
        return lambda: cuda.compute([seq] * 64)
    try:  # the device image has PyTorch: the NVML path still sees a busy GPU
        torch: Any = importlib.import_module("torch")
        if torch.cuda.is_available():
            a = torch.randn(4096, 4096, device="cuda")
            return lambda: (a @ a).sum().item()
    except ImportError:
        pass
    raise Skip("NVML works but nothing here can load the GPU (no CUDA EP, no torch)")


def tensorrt(ctx: Context) -> list[str]:
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"this onnxruntime ({ort.__version__}) has no TensorRT provider")
    why = _provider_load_error("tensorrt")
    if why is not None or ctx.cuda is None:
        raise Skip(why or "no CUDA session (see the CUDA EP section)")
    config = ctx.config()
    options = {**_tensorrt_options(config, 32), "trt_engine_cache_path": str(ctx.scratch)}
    started = time.perf_counter()
    model = ctx.model(config.variant_path("fp16"),
                      [("TensorrtExecutionProvider", options), "CPUExecutionProvider"], "fp16")
    if model.runtime.provider != "TensorrtExecutionProvider":
        raise Skip(f"ONNX Runtime placed the model on {model.runtime.providers}")
    p50, p99, batch, rate = _timings(model, SHORT, 20 if ctx.quick else 200)
    return [f"session and engine in {time.perf_counter() - started:.1f} s",
            f"short texts: p50 {p50:.2f} ms, p99 {p99:.2f} ms at batch 1; {rate:.0f} texts/s "
            f"at batch {batch}"]


def sections() -> list[tuple[str, Callable[[Context], list[str]]]]:
    from bench.gpu_backend import backend_cold_start

    return [("providers and GPUs", providers_and_gpus),
            ("fp32 graph built from the carried fp16 one", fp32_from_fp16),
            ("CUDA EP, fp16 graph", cuda_fp16),
            ("latency: GPU fp16 vs CPU fp32", latency),
            ("GPU metrics under load (NVML)", gpu_metrics_under_load),
            ("backend cold start and /metrics", backend_cold_start),
            ("TensorRT EP", tensorrt)]
