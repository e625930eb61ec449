"""The OpenVINO execution provider, and ``--device auto``'s choice between it and the CPU EP.

OpenVINO comes from the ``onnxruntime-openvino`` wheel, which *replaces* ``onnxruntime`` (the
same import name): it cannot live beside ``onnxruntime-gpu`` in one environment, so it gets its
own (``make openvino`` builds ``.venv-openvino``; docs/BACKEND.md). Where it is installed,
``get_available_providers()`` lists ``OpenVINOExecutionProvider`` next to the CPU one.

The whole fused fp32 graph (including ORT's ``Attention`` and ``BiasGelu`` contrib ops) runs as
one OpenVINO subgraph: an ORT profile of a run shows a single ``OpenVINO-EP-subgraph_1`` node.
Inference precision is pinned to f32 twice over (``precision`` and the CPU plugin's
``INFERENCE_PRECISION_HINT``): on a CPU with bf16 instructions OpenVINO may otherwise run bf16,
which moves embeddings more than the cache's equality promises allow.

``auto`` without a GPU picks OpenVINO only where it is installed *and* faster on this machine:
both sessions run the same short probe (``probe_seconds``) and the faster wins, one log line
giving both figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

OPENVINO = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"
PRECISION = "FP32"
# Warm-up probe: (batch, tokens) shapes, each run once untimed then timed PROBE_ROUNDS times.
PROBE_SHAPES = ((1, 16), (1, 128), (8, 64))
PROBE_ROUNDS = 3


def available() -> str | None:
    """None when this onnxruntime offers the OpenVINO EP, else why it does not."""
    providers = ort.get_available_providers()
    if OPENVINO in providers:
        return None
    return (f"this onnxruntime ({ort.__version__}) has no {OPENVINO} (it has {providers}); "
            "install onnxruntime-openvino in its own environment: make openvino")


def provider_options(threads: int) -> dict[str, str]:
    """OpenVINO EP options: the CPU device, f32 stated explicitly, ``threads`` threads."""
    return {
        "device_type": "CPU",
        "precision": PRECISION,
        "num_of_threads": str(threads),
        # The plugin's own hint, so f32 holds whatever the EP maps "precision" to.
        "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}),
    }


def providers(threads: int) -> list[Any]:
    """The provider list of an OpenVINO session (the CPU EP takes any node OpenVINO refuses)."""
    return [(OPENVINO, provider_options(threads)), CPU]


def probe_seconds(session: ort.InferenceSession, inputs: tuple[str, str]) -> float:
    """Seconds ``session`` takes for the probe shapes (after one untimed run of each)."""
    ids_name, mask_name = inputs
    total = 0.0
    for batch, tokens in PROBE_SHAPES:
        ids = np.full((batch, tokens), 2023, dtype=np.int64)  # any in-vocabulary token
        ids[:, 0], ids[:, -1] = 101, 102
        feed = {ids_name: ids, mask_name: np.ones_like(ids)}
        session.run(None, feed)
        started = time.perf_counter()
        for _ in range(PROBE_ROUNDS):
            session.run(None, feed)
        total += time.perf_counter() - started
    return total


def faster(candidates: dict[str, ort.InferenceSession], inputs: tuple[str, str]
           ) -> tuple[str, dict[str, float]]:
    """The name of the fastest session on the probe, and every probe time in seconds."""
    timings = {name: probe_seconds(session, inputs) for name, session in candidates.items()}
    return min(timings, key=lambda name: timings[name]), timings


def describe(path: Path) -> dict[str, Any]:
    """Log fields for an OpenVINO session of ``path``."""
    return {"provider": OPENVINO, "precision": PRECISION, "graph": path.name}
