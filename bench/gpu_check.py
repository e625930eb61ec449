"""``python -m bench gpu_check``: the GPU path, checked in one short run (``bench/gpu_check.sh``).

Sections, each ending ``ran``, ``skipped: <why>`` or ``FAILED: <why>``: the providers this
onnxruntime has and the GPUs NVML sees; the fp32 graph built from the carried fp16 one
(``gpu_carry.upcast``); the CUDA EP with the fp16 graph (load time, cosine against the fp32
graph on the CPU EP and against the reference embeddings); p50/p99 at batch 1 and texts/s at
the best batch, GPU against CPU, short and long texts; the GPU metrics under load (NVML through
``backend/gpu.py``, non-zero utilisation expected); the TensorRT EP; a backend started on the
GPU with its cold-start figures and GPU series from its own ``/metrics``. Everything is
bounded by ``--budget-s`` (default 270 s, inside the device's five minutes); on a machine
without a GPU the GPU sections say why they were skipped. Exit 1 only when a section failed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.gpu_carry import CARRY_MODELS, ROOT, carried_bytes, prepare
from bench.gpu_sections import Context, Skip, sections


def run_sections(ctx: Context, chosen: Sequence[tuple[str, Callable[[Context], list[str]]]]
                 ) -> dict[str, str]:
    """Runs each section within the budget; prints its lines and outcome as it goes."""
    outcomes: dict[str, str] = {}
    for name, section in chosen:
        print(f"\n### {name}", flush=True)
        if ctx.left_s() < 10:
            outcomes[name] = "skipped: out of time (--budget-s)"
        else:
            try:
                for line in section(ctx):
                    print(line, flush=True)
                outcomes[name] = "ran"
            except Skip as why:
                outcomes[name] = f"skipped: {why}"
            except Exception as exc:  # a check must report every section, whatever breaks
                outcomes[name] = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
        print(outcomes[name], flush=True)
    return outcomes


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpu_check")
    parser.add_argument("--models", type=Path, default=None,
                        help="model repository (default: .bench/gpu-models when prepared, "
                        "else models)")
    parser.add_argument("--prepare", action="store_true",
                        help="copy the fp16 model and download the device's missing wheels "
                        "into .bench/gpu-models and .whl, then stop")
    parser.add_argument("--no-wheels", action="store_true", help="with --prepare: models only")
    parser.add_argument("--budget-s", type=float, default=270.0)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (tests)")
    args = parser.parse_args(argv)
    if args.prepare:
        target = prepare(ROOT / "models", wheels=not args.no_wheels)
        print(f"prepared {target}; carry .bench/gpu-models and .whl "
              f"({carried_bytes() / 2**20:.1f} MiB of the 64 MiB limit)")
        return 0
    models = args.models or (CARRY_MODELS if (CARRY_MODELS / "minilm").exists()
                             else ROOT / "models")
    ctx = Context(models_dir=models, deadline=time.monotonic() + args.budget_s,
                  quick=args.quick)
    print(f"gpu_check: models {models}, budget {args.budget_s:.0f} s", flush=True)
    outcomes = run_sections(ctx, sections())
    print("\n### summary")
    for name, outcome in outcomes.items():
        print(f"- {name}: {outcome}")
    return 1 if any(o.startswith("FAILED") for o in outcomes.values()) else 0
