# densecnn service image: the steps of `make venv` + `make serve`, without the test extras.
#
#   docker build -t densecnn .
#   docker run -p 8000:8000 densecnn                      # then open http://127.0.0.1:8000
#
# CPU torch by default. For a CUDA image pick a CUDA base (Python >= 3.10 is installed if it has none) and the
# torch wheel index of a matching CUDA version, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#                --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 -t densecnn:cuda .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH

# g++ builds the C++ extension against the installed torch; tcmalloc serves torch's tensors from reused memory
# (preloaded below; Debian/Ubuntu name the package with or without the t64 suffix); python3 + venv only where the
# base lacks them
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && (apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
     || apt-get install -y --no-install-recommends libtcmalloc-minimal4t64) \
 && ln -s "$(ls /usr/lib/*/libtcmalloc_minimal.so.4 | head -n 1)" /usr/local/lib/libtcmalloc_minimal.so.4 \
 && if ! command -v python3 >/dev/null || ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get install -y --no-install-recommends python3 python3-venv python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /srv/densecnn
COPY pyproject.toml setup.py README.md ./
COPY cuda_ext/ cuda_ext/
COPY densecnn/ densecnn/
COPY app/ app/
COPY models/ models/

# as `make venv`: torch==2.13.0 first, then the project with the service's extra, built against it
# (--no-build-isolation); app/ is installed as the package densecnn_app
RUN python3 -m venv /opt/venv \
 && pip install -q --upgrade pip setuptools wheel \
 && pip install -q --index-url "${TORCH_INDEX_URL}" torch==2.13.0 \
 && pip install -q --no-build-isolation '.[serve]' \
 && python -c "import densecnn, densecnn_app"

RUN useradd --create-home --uid 10001 densecnn
USER densecnn

# the package is installed into the venv, so point the service at the shipped models explicitly; tcmalloc makes
# warm requests 13-19% faster (docs/performance.md, "Memory allocator")
ENV DENSECNN_MODEL_DIR=/srv/densecnn/models \
    LD_PRELOAD=/usr/local/lib/libtcmalloc_minimal.so.4
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
CMD ["densecnn", "serve", "--host", "0.0.0.0", "--port", "8000"]
