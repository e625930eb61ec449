#!/usr/bin/env bash
# `make run`: a backend with the built-in model and a gateway in front of it, on localhost.
# Ctrl-C (or SIGTERM) stops everything this script started.
set -euo pipefail
PY=${PY:-.venv/bin/python}
BACKEND_PORT=${BACKEND_PORT:-8001}
GATEWAY_PORT=${GATEWAY_PORT:-8080}
pids=()
cleanup() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

"$PY" -m backend serve --models models --host 127.0.0.1 --port "$BACKEND_PORT" &
pids+=($!)
"$PY" -m gateway serve --host 127.0.0.1 --port "$GATEWAY_PORT" \
  --backend "http://127.0.0.1:$BACKEND_PORT" ${GATEWAY_ARGS:-} &
pids+=($!)
echo "backend: http://127.0.0.1:$BACKEND_PORT  gateway: http://127.0.0.1:$GATEWAY_PORT  (Ctrl-C stops both)"
wait -n "${pids[@]}"
