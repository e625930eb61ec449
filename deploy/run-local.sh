#!/usr/bin/env bash
# `make run`: a backend with the built-in model and a gateway in front of it, on localhost.
# Prints one "ready" line once the gateway's /readyz answers 200 (a backend has loaded and warmed
# up its model); exits non-zero, saying why, if either process dies first or readiness takes
# longer than READY_TIMEOUT_S (60 s). Ctrl-C (or SIGTERM) stops everything this script started;
# a stop asked for is a clean exit (status 0), so `kill <pid>` leaves make nothing to report.
set -euo pipefail
PY=${PY:-.venv/bin/python}
BACKEND_PORT=${BACKEND_PORT:-8001}
BACKEND_GRPC_PORT=${BACKEND_GRPC_PORT:-}  # empty: the backend's default (8002)
GATEWAY_PORT=${GATEWAY_PORT:-8080}
# The policy the gateway serves: the repo's policies/ folder, so an edit there takes effect
# (reloaded on change). POLICIES=path/to/file.yaml, or GATEWAY_ARGS="--policies ...", to change.
POLICIES=${POLICIES:-policies}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}
backend_url="http://127.0.0.1:$BACKEND_PORT"
gateway_url="http://127.0.0.1:$GATEWAY_PORT"
pids=()
names=()

cleanup() {
  trap '' INT TERM  # a second Ctrl-C must not cut the clean-up short (it is bounded below)
  trap - EXIT
  local pid i
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for ((i = 0; i < 100; i++)); do  # up to 10 s for a clean stop, then SIGKILL
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
# SIGTERM is how `kill` (the ready line says so) and service managers ask for a stop: after the
# clean-up, exit 0, or make would report "Error 143" for a stop that went as asked.
trap 'echo "make run: stopping (SIGTERM)" >&2; exit 0' TERM

start() {  # start NAME COMMAND...: run it in the background and remember its PID
  local name=$1
  shift
  "$@" &
  pids+=("$!")
  names+=("$name")
}

# check_alive WHEN [STATUS]: if one of them has exited, say which, with its status, and fail.
# STATUS: the status `wait -n` already collected (a PID cannot be waited for twice).
check_alive() {
  local i status
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      if (($# > 1)); then status=$2; else status=0; wait "${pids[$i]}" || status=$?; fi
      echo "make run: the ${names[$i]} (pid ${pids[$i]}) exited with status $status $1;" \
        "its log is above" >&2
      exit 1
    fi
  done
}

# One probe of /readyz: exit 0 on 200; otherwise print what it answered.
probe_ready() {
  "$PY" - "$gateway_url/readyz" <<'PYEOF'
import sys
import urllib.error
import urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as resp:
        sys.exit(0 if resp.status == 200 else f"HTTP {resp.status}")
except urllib.error.HTTPError as exc:
    print(f"HTTP {exc.code} {exc.read(300).decode(errors='replace')}")
except (urllib.error.URLError, OSError) as exc:
    print(f"no answer ({getattr(exc, 'reason', exc)})")
sys.exit(1)
PYEOF
}

grpc_args=()
if [[ -n $BACKEND_GRPC_PORT ]]; then grpc_args=(--grpc-port "$BACKEND_GRPC_PORT"); fi
start backend "$PY" -m backend serve --models models --host 127.0.0.1 --port "$BACKEND_PORT" \
  ${grpc_args[@]+"${grpc_args[@]}"}
# The default workers (one per core): they share the node cache (cache.node.path, by default
# ~/.cache/edge-gateway/node/<deployment tag>), so the Quick start's second call is a HIT
# whichever worker answers.
# GATEWAY_ARGS comes last, so `GATEWAY_ARGS="--workers 1"` still overrides it.
# shellcheck disable=SC2086  # GATEWAY_ARGS is a list of flags: split it on purpose
start gateway "$PY" -m gateway serve --host 127.0.0.1 --port "$GATEWAY_PORT" \
  --backend "$backend_url" --policies "$POLICIES" ${GATEWAY_ARGS:-}
echo "make run (pid $$; Ctrl-C or \`kill $$\` stops everything): starting backend" \
  "(pid ${pids[0]}) on $backend_url and gateway (pid ${pids[1]}) on $gateway_url;" \
  "waiting up to ${READY_TIMEOUT_S}s for $gateway_url/readyz"

deadline=$((SECONDS + READY_TIMEOUT_S))
last=""
until last=$(probe_ready); do
  check_alive "before the gateway was ready"
  if ((SECONDS >= deadline)); then
    echo "make run: $gateway_url/readyz did not answer 200 within ${READY_TIMEOUT_S}s" \
      "(last answer: ${last:-none}); stopping (raise READY_TIMEOUT_S on a slow machine)" >&2
    exit 1
  fi
  sleep 0.5
done

echo "ready: gateway $gateway_url (backend $backend_url). Try:" \
  "curl -si $gateway_url/v1/embeddings -H 'Content-Type: application/json'" \
  "-d '{\"model\": \"minilm\", \"input\": [\"How do I reset my password?\"]}'" \
  " (Ctrl-C stops both)"

# Serve until Ctrl-C, or until one of the two exits on its own (then stop the other too).
status=0
wait -n "${pids[@]}" || status=$?
if ((status == 0)); then
  # A clean exit: both services stop cleanly on SIGINT, and bash does not run the INT trap
  # when the child it waits for handled the signal itself (Ctrl-C reaches the whole group).
  echo "make run: stopped" >&2
  exit 0
fi
check_alive "while serving" "$status"
exit 1
