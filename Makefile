# One command each on a fresh clone: every target creates/reuses .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: venv test lint serve bench cuda-check level-check gpu-check docker-check browser qt-libs clean

venv: $(STAMP)

# torch==2.13.0 first (the CPU wheel on local disk); any other spelling pulls a multi-GB CUDA build.
# --no-build-isolation: the C++ extension builds against the torch already in the venv.
$(STAMP): pyproject.toml setup.py $(wildcard cuda_ext/*.cpp cuda_ext/*.h cuda_ext/*.cuh cuda_ext/*.cu)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-build-isolation -e '.[all,test]'
	touch $(STAMP)

# Debian's chromium for the browser test (no browser download is possible here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# For the napari tests: Xvfb (an X server in memory; pytest-xvfb starts one per test process) and the system
# libraries PyQt6's wheel loads on it (Qt's xcb platform, OpenGL with Mesa's software renderer for napari's canvas,
# fonts). Qt's offscreen platform has no OpenGL, and napari's canvas needs it. Installed only when one is missing.
QT_LIBS := xvfb libgl1 libegl1 libgl1-mesa-dri libglib2.0-0 libfontconfig1 fonts-dejavu-core libdbus-1-3 \
	libxkbcommon-x11-0 libx11-xcb1 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 \
	libxcb-render-util0 libxcb-shape0 libxcb-xfixes0

qt-libs:
	@dpkg -s $(QT_LIBS) >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(QT_LIBS) >/dev/null; }

test: venv browser qt-libs
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: venv
	$(PY) -m ruff check densecnn app tests scripts
	$(PY) -m ruff format --check densecnn app tests scripts

# torch's own tensors from tcmalloc's reused memory where Debian's libtcmalloc-minimal4 is installed: warm forwards
# 13-19% and training steps 4-14% faster (docs/performance.md, "Memory allocator").
TCMALLOC := $(firstword $(wildcard /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4))

serve: venv
	$(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC) )$(VENV)/bin/densecnn serve --host $(HOST) --port $(PORT)

bench: venv
	$(VENV)/bin/densecnn bench --out docs/benchmarks

cuda-check:
	bash scripts/cuda_check.sh

# The kernels' tests on the loops of a lower x86-64 level than this CPU's (LEVEL=v3: AVX2, or baseline), built in a
# copy of the tree (docs/kernels.md, "Build flags").
LEVEL ?= v3
level-check: venv
	bash scripts/level_check.sh $(LEVEL)

# On a machine with a GPU and a CUDA build of torch (not the venv: it holds the CPU wheel): build the extension with
# CUDA in place, run the tests with the CUDA cases and the CUDA benchmark; results in gpu-check/ (docs/cuda.md).
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh

# The Dockerfile built with podman on a Debian base made here and run: /readyz, a label map equal to .venv's,
# a non-root server, a clean SIGTERM, the image's size (docs/service.md, "Container").
docker-check: venv
	bash scripts/docker_check.sh

clean:
	rm -rf $(VENV) build *.egg-info
