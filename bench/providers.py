"""``python -m bench providers [--quick] [--threads N]``: execution providers side by side.

In one process and one run, the same model and the same token ids through ONNX Runtime's CPU
EP and the OpenVINO EP (f32): p50 of one text per call (batch 1), and texts per second at the
best batch size, for short texts (~10 tokens) and long ones (256 tokens). The rounds of the
two providers interleave so that a shared machine's noise falls on both alike. What is timed
is ``EmbeddingModel.compute`` (pad + ONNX Runtime run) on pre-tokenized ids: tokenizing is
the same for every provider.

OpenVINO needs its own environment (``.venv-openvino``, ``make openvino``): run from ``.venv``
the benchmark re-runs itself there when it exists, else it measures the CPU EP alone and says
so. The last column is the CPU that other processes used during each row (cores): on a
shared machine, figures measured beside other load do not decide.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench import openvino_env
from bench.procs import Meter

SHORT = "How do I reset my password?"
LONG = "the quick brown fox jumps over the lazy dog " * 40  # truncated to 256 tokens
BATCHES = (1, 2, 4, 8, 16, 32)
QUICK_BATCHES = (1, 8, 32)


@dataclass
class Row:
    provider: str
    texts: str
    tokens: int
    p50_ms: float
    best_batch: int
    texts_per_s: float
    other_cores: float


def _timed(fn: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def measure(models: dict[str, object], *, quick: bool) -> list[Row]:
    """Every provider x (short, long): p50 at batch 1, best throughput over the batch sizes."""
    from backend.model import EmbeddingModel

    runs = {name: m for name, m in models.items() if isinstance(m, EmbeddingModel)}
    rows = []
    meter = Meter()
    for label, text in (("short", SHORT), ("long", LONG)):
        any_model = next(iter(runs.values()))
        (seq,) = any_model.tokenize([text])
        p50_rounds = 30 if quick else 200
        batch_rounds = 3 if quick else 10
        lat: dict[str, list[float]] = {name: [] for name in runs}
        thr: dict[str, dict[int, list[float]]] = {name: {} for name in runs}
        other: dict[str, list[float]] = {name: [] for name in runs}
        for model in runs.values():  # untimed first calls: arenas, kernels
            for batch in QUICK_BATCHES if quick else BATCHES:
                model.compute([seq] * batch)
        # Interleaved: a burst of each provider in turn, so noise falls on both.
        for _ in range(5):
            for name, model in runs.items():
                meter.start()
                lat[name] += _timed(partial(model.compute, [seq]), p50_rounds // 5)
                for batch in QUICK_BATCHES if quick else BATCHES:
                    thr[name].setdefault(batch, []).extend(
                        _timed(partial(model.compute, [seq] * batch),
                               max(1, batch_rounds // 5 + (1 if batch <= 8 else 0))))
                other[name].append(meter.stop())
        for name in runs:
            per_batch = {b: b / float(np.median(s)) for b, s in thr[name].items()}
            best = max(per_batch, key=per_batch.__getitem__)
            rows.append(Row(name.replace("ExecutionProvider", ""), label, len(seq),
                            float(np.median(lat[name])) * 1000.0, best, per_batch[best],
                            float(np.mean(other[name]))))
    return rows


def render(rows: Sequence[Row], threads: int) -> str:
    lines = [
        f"ONNX Runtime threads per session: {threads}; fp32 graph; OpenVINO at f32.",
        "",
        "| provider | texts | tokens | p50 batch 1 (ms) | best batch | texts/s at best batch "
        "| other processes' CPU (cores) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r.provider} | {r.texts} | {r.tokens} | {r.p50_ms:.2f} | "
                     f"{r.best_batch} | {r.texts_per_s:.1f} | {r.other_cores:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench providers")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batch sizes")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--models", default="models", help="model repository")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    here = Path(sys.executable).resolve()
    if ("OpenVINOExecutionProvider" not in ort.get_available_providers()
            and openvino_env.is_current()
            and here != openvino_env.python().resolve()):
        print(f"running in {openvino_env.VENV.name} (OpenVINO lives there)", flush=True)
        return subprocess.run([str(openvino_env.python()), "-m", "bench", "providers", *argv],
                              cwd=openvino_env.ROOT, check=False).returncode

    from backend.model import load_models
    from backend.settings import Device, ServeSettings

    models: dict[str, object] = {}
    choices: tuple[tuple[Device, str], ...] = (
        ("cpu", "CPUExecutionProvider"), ("openvino", "OpenVINOExecutionProvider"))
    for device, provider in choices:
        if provider not in ort.get_available_providers():
            print(f"skipped {provider}: this onnxruntime ({ort.__version__}) does not have "
                  "it; `make openvino` builds .venv-openvino, where it runs", flush=True)
            continue
        (model,) = load_models(ServeSettings(models_dir=Path(args.models), device=device,
                                             threads=args.threads))
        models[provider] = model
    print(render(measure(models, quick=args.quick), args.threads))
    return 0
