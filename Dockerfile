# transformer-serve: the inference service with the bundled model store.
#
#   docker build --target cpu -t transformer-serve:cpu .   # python:3.11-slim, onnxruntime (the default target)
#   docker build --target gpu -t transformer-serve:gpu .   # CUDA runtime + cuDNN, onnxruntime-gpu only
#
# Both final stages: no compilers, uid 10001, the command as an exec-form ENTRYPOINT with `serve` as
# its CMD (SIGTERM reaches the server, which drains; settings from SERVE_* variables, or flags after
# `serve`: `docker run IMAGE serve --help`), HEALTHCHECK on /healthz, a read-only root filesystem works (only /tmp need be writable).
# ORT_DISABLE_TELEMETRY=1: onnxruntime 1.31+ otherwise sets up telemetry on Linux and tries to
# persist a device id (a warning on a read-only root); CUDA_CACHE_PATH keeps the CUDA JIT cache in /tmp.
# `make image-check` builds and runs the CPU target without a Docker daemon (docs/deployment.md).

ARG PYTHON_IMAGE=python:3.11-slim
# onnxruntime-gpu 1.31 on PyPI is built for CUDA 13 and cuDNN 9: change the two together.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu22.04
ARG ONNXRUNTIME_GPU=onnxruntime-gpu==1.31.1

# ---- GPU: Python 3.11 (Ubuntu 22.04's package) on the CUDA runtime image -----------------------
FROM ${CUDA_IMAGE} AS gpu-base
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 \
 && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS gpu-builder
ARG ONNXRUNTIME_GPU
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv
COPY pyproject.toml README.md /src/
COPY docker/requirements.py /src/docker/
# Dependencies first (a layer that survives code edits), onnxruntime swapped for onnxruntime-gpu.
RUN python3.11 /src/docker/requirements.py /src/pyproject.toml --replace "onnxruntime=${ONNXRUNTIME_GPU}" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY service /src/service
RUN /opt/venv/bin/pip install --no-deps /src \
 && if /opt/venv/bin/pip show onnxruntime >/dev/null 2>&1; then echo "CPU onnxruntime must not be installed" >&2; exit 1; fi

# ---- CPU: python:3.11-slim -----------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu-builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
COPY pyproject.toml README.md /src/
COPY docker/requirements.py /src/docker/
RUN python3 /src/docker/requirements.py /src/pyproject.toml > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY service /src/service
RUN /opt/venv/bin/pip install --no-deps /src

# ---- final stages ---------------------------------------------------------------------------------
FROM gpu-base AS gpu
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin app
COPY --from=gpu-builder /opt/venv /opt/venv
COPY docker/healthcheck.py /app/healthcheck.py
COPY model_store /app/model_store
WORKDIR /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SERVE_HOST=0.0.0.0 \
    SERVE_PORT=8000 \
    SERVE_MODEL_STORE=/app/model_store \
    SERVE_PROVIDERS=cuda,cpu \
    SERVE_VARIANT=fp16 \
    ORT_DISABLE_TELEMETRY=1 \
    CUDA_CACHE_PATH=/tmp/cuda-cache
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python", "/app/healthcheck.py"]
ENTRYPOINT ["transformer-serve"]
CMD ["serve"]

# The last stage is the default target: a plain build gives the CPU image.
FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin app
COPY --from=cpu-builder /opt/venv /opt/venv
COPY docker/healthcheck.py /app/healthcheck.py
COPY model_store /app/model_store
WORKDIR /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SERVE_HOST=0.0.0.0 \
    SERVE_PORT=8000 \
    SERVE_MODEL_STORE=/app/model_store \
    ORT_DISABLE_TELEMETRY=1
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 CMD ["python", "/app/healthcheck.py"]
ENTRYPOINT ["transformer-serve"]
CMD ["serve"]
