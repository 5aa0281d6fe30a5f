# densecnn service image: the steps of `make venv` + `make serve`, without the test extras, in three stages:
#   torch    the base + tcmalloc (+ python3 and venv where it cannot make a venv) + a venv holding torch==2.13.0
#   build    torch + g++ and Python's headers: builds densecnn's wheel (the C++ extension against that torch)
#   runtime  torch + the wheel with the service's extra, the shipped models, a non-root user (no compiler)
#
#   docker build -t densecnn .
#   docker run -p 8000:8000 densecnn                      # then open http://127.0.0.1:8000
#
# BASE_IMAGE: any Debian or Ubuntu image, with or without Python (python3, venv and the headers are installed where
# it lacks them), or an official Python image (3.10 or later). The torch wheel comes from TORCH_INDEX_URL (CPU by
# default), or, with TORCH_FIND_LINKS, from a directory of wheels mounted into the build (the other packages then
# come from PyPI). For a CUDA image (not built here) pick a CUDA base, the torch wheel index of a matching CUDA
# version and, for densecnn's CUDA kernels, the variables of docs/cuda.md, e.g.
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#                --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 \
#                --build-arg FORCE_CUDA=1 --build-arg CUDA_HOME=/usr/local/cuda \
#                --build-arg TORCH_CUDA_ARCH_LIST="8.0;9.0" -t densecnn:cuda .
# PIP_CERT names a CA bundle for pip (e.g. a proxy's, mounted into the build); unset, pip trusts its own bundle.
# Podman, a local wheel directory and the host's CA bundle: docs/service.md, "Container".
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS torch
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=
ARG PIP_CERT
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH

# tcmalloc serves torch's tensors from reused memory (preloaded below; Debian/Ubuntu name the package with or
# without the t64 suffix); python3 + venv only where the base cannot make a venv (Debian's python3 alone cannot)
RUN apt-get update \
 && (apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
     || apt-get install -y --no-install-recommends libtcmalloc-minimal4t64) \
 && ln -s "$(ls /usr/lib/*/libtcmalloc_minimal.so.4 | head -n 1)" /usr/local/lib/libtcmalloc_minimal.so.4 \
 && if ! python3 -m venv /tmp/venv-probe >/dev/null 2>&1; then \
      apt-get install -y --no-install-recommends python3 python3-venv; fi \
 && rm -rf /tmp/venv-probe /var/lib/apt/lists/* /var/cache/apt/*

# as `make venv`: torch==2.13.0 first (any other spelling can pull a multi-GB CUDA build from PyPI)
RUN python3 -m venv /opt/venv \
 && if [ -n "${TORCH_FIND_LINKS}" ]; then wheels="--find-links=${TORCH_FIND_LINKS}"; \
    else wheels="--index-url=${TORCH_INDEX_URL}"; fi \
 && pip install -q "${wheels}" torch==2.13.0

FROM torch AS build
ARG PIP_CERT
ARG FORCE_CUDA=0
ARG CUDA_HOME=
ARG TORCH_CUDA_ARCH_LIST=
# g++ and Python.h build the extension; the headers come from the base's own Python where it has them (official
# Python images), else from the distribution's python3-dev
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && if [ ! -e "$(python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cuda_ext/ cuda_ext/
COPY densecnn/ densecnn/
COPY app/ app/
# --no-build-isolation: the extension builds against the torch in the venv (ninja compiles its sources in
# parallel; -g0: no debug information); app/ becomes the package densecnn_app
RUN pip install -q --upgrade pip setuptools wheel ninja \
 && CFLAGS=-g0 pip wheel -q --no-deps --no-build-isolation --wheel-dir /dist .

FROM torch AS runtime
ARG PIP_CERT
# COPY, not a bind mount from the build stage: podman caches a RUN with such a mount without looking at what it
# mounts, so a changed wheel would not be installed; the wheel (a few MB) stays in this layer
COPY --from=build /dist /tmp/dist
RUN pip install -q "$(ls /tmp/dist/densecnn-*.whl)[serve]" \
 && python -c "import densecnn._C, densecnn_app"
COPY models/ /srv/densecnn/models/
RUN useradd --create-home --uid 10001 densecnn \
 && install -d -o densecnn -g densecnn /var/lib/densecnn
USER densecnn
WORKDIR /home/densecnn

# the package is installed into the venv, so point the service at the shipped models explicitly; jobs, uploads and
# the API keys' database live in the volume; tcmalloc makes warm requests 13-19% faster (docs/performance.md,
# "Memory allocator")
ENV DENSECNN_MODEL_DIR=/srv/densecnn/models \
    DENSECNN_DATA_DIR=/var/lib/densecnn \
    LD_PRELOAD=/usr/local/lib/libtcmalloc_minimal.so.4
VOLUME /var/lib/densecnn
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
# listening beyond the container's loopback, the server needs API keys: `densecnn keys add NAME` in the volume first
CMD ["densecnn", "serve", "--host", "0.0.0.0", "--port", "8000"]
