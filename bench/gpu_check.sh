#!/usr/bin/env bash
# The GPU path in one short run, for a GPU machine with no network (docs/BACKEND.md):
# providers, the CUDA and TensorRT EPs with the fp16 graph, fp16 vs fp32 cosine (the fp32 graph
# is built there from the fp16 one), p50/p99 and best-batch throughput against the CPU EP, GPU
# metrics under load, and a backend's cold start. It runs on a CPU-only machine too: every
# section says "ran", "skipped: <why>" or "FAILED: <why>", and a summary lists them all.
#
# Before (here, with network): python -m bench gpu_check --prepare
#   copies the fp16 model into .bench/gpu-models and the wheels the device lacks into .whl
#   (~46 MiB together); carry both (.bench/gpu-models and .whl) to the device machine.
# There:  bash bench/gpu_check.sh            (about 5 minutes at most: BUDGET_S, default 270)
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
missing() {
  "$PY" -c '
import importlib.util as u
need = ["numpy", "onnx", "onnxruntime", "tokenizers", "orjson", "aiohttp", "prometheus_client",
        "grpc", "google.protobuf"]
gone = [n for n in need if u.find_spec(n) is None]
if "google.protobuf" not in gone:
    from google.protobuf import __version__ as v
    if tuple(int(x) for x in v.split(".")[:3]) < (6, 33, 5):
        gone.append(f"protobuf>=6.33.5 (has {v})")
print(" ".join(gone))' 2>&1
}
lacking=$(missing)
if [[ -n "$lacking" ]] && compgen -G ".whl/*.whl" >/dev/null; then
  # No network there: the carried wheels only, into a folder of their own.
  echo "gpu_check: $PY lacks $lacking: installing the carried wheels (.whl)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu-check-site .whl/*.whl
  export PYTHONPATH="/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}"
  lacking=$(missing)
fi
if [[ -n "$lacking" ]]; then
  echo "gpu_check: every section skipped: $PY lacks: $lacking (carry their wheels in .whl)"
  exit 2
fi
export PYTHONUNBUFFERED=1
exec timeout --kill-after=10 "$(( ${BUDGET_S:-270} + 25 ))" \
  "$PY" -m bench gpu_check --budget-s "${BUDGET_S:-270}" "$@"
