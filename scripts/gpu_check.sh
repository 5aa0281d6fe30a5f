#!/usr/bin/env bash
# `make gpu-check`: on a machine with an NVIDIA GPU and a CUDA build of torch, build densecnn's extension with its CUDA
# kernels against that torch (in place: nothing is installed or downloaded), run the test suite with the CUDA cases
# enabled, then the CUDA benchmark. Everything is written under $OUT (default gpu-check/):
#   build.log    the extension's build        tests.log, junit.xml   the test suite
#   bench.json   the benchmark (scripts/gpu_bench.py)                summary.txt   one line per step
# TESTS= limits the test step to some paths (default: the whole suite).
# Without a GPU (or without a CUDA build of torch) it says so in one line and exits 1. docs/cuda.md explains it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
OUT="${OUT:-gpu-check}"
TESTS="${TESTS:-tests}"  # what the test step runs: the whole suite, or e.g. TESTS="tests/ops tests/core" on a short lease

if ! probe="$("$PYTHON" - 2>&1 <<'PY'
try:
    import torch
except ImportError:
    raise SystemExit("no torch installed") from None
if not torch.version.cuda:
    raise SystemExit(f"torch {torch.__version__} is a CPU-only build")
if not torch.cuda.is_available():
    raise SystemExit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
major, minor = torch.cuda.get_device_capability(0)
print(f"{torch.cuda.get_device_name(0)}|{major}.{minor}|torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
)"; then
  echo "gpu-check: no GPU check possible with $PYTHON: $(tail -n 1 <<<"$probe"); run it on a GPU machine, PYTHON= the python with a CUDA torch" >&2
  exit 1
fi
IFS='|' read -r device capability versions <<<"$probe"

CUDA_HOME="${CUDA_HOME:-$("$PYTHON" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")')}"
if [[ -z "$CUDA_HOME" || ! -x "$CUDA_HOME/bin/nvcc" ]]; then
  echo "gpu-check: FAILED — no CUDA toolkit (nvcc) found; set CUDA_HOME to the toolkit matching torch's CUDA" >&2
  exit 1
fi
for module in pytest hypothesis; do
  if ! "$PYTHON" -c "import $module" 2>/dev/null; then
    echo "gpu-check: FAILED — $PYTHON cannot import $module, which the test suite needs" >&2
    exit 1
  fi
done

mkdir -p "$OUT"
summary="$OUT/summary.txt"
echo "gpu-check: $device (compute capability $capability), $versions, nvcc in $CUDA_HOME" | tee "$summary"

# The extension with its CUDA kernels, for this GPU's architecture only (a short build), next to the sources.
# Compiled and linked by the system's C++ compiler (CC/CXX override): a Python built with a GCC of its own may name
# one that links libstdc++ statically, and that private copy crashed formatting the ops' error messages.
start=$SECONDS
if ! CC="${CC:-c++}" CXX="${CXX:-c++}" CUDA_HOME="$CUDA_HOME" FORCE_CUDA=1 \
    TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$capability}" \
    "$PYTHON" setup.py build_ext --inplace >"$OUT/build.log" 2>&1; then
  echo "gpu-check: FAILED — the CUDA build of the extension; see $OUT/build.log" | tee -a "$summary" >&2
  exit 1
fi
if nm -D --defined-only densecnn/_C*.so 2>/dev/null | grep -q '_ZNSo9_M_insertIlEERSoT_$'; then
  echo "gpu-check: FAILED — the extension carries its own copy of libstdc++ (linked statically); build it with a" \
    "compiler that links libstdc++ as a shared library: CC=g++ CXX=g++ (the system's)" | tee -a "$summary" >&2
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c 'import torch, densecnn.ops.ext as ext
assert ext.available(), ext.load_error()
assert torch._C._dispatch_has_kernel_for_dispatch_key("densecnn::max_pool", "CUDA"), "no CUDA kernels registered"' \
    >>"$OUT/build.log" 2>&1; then
  echo "gpu-check: FAILED — the built extension has no CUDA kernels; see $OUT/build.log" | tee -a "$summary" >&2
  exit 1
fi
echo "gpu-check: ok      extension built with CUDA kernels for sm_${capability/./} ($((SECONDS - start)) s)" | tee -a "$summary"

# The whole suite: with a GPU, the CUDA cases run (tests/ops/test_cuda.py: opcheck, gradcheck, every solver against
# the CPU reference, dense nets against patch scanning; tests/ops/test_ext_ops.py's device tests), and none of them
# may skip.
# Test modules that need a package this machine lacks (the service's, Dask's, ...) are listed as not run
# (scripts/gpu_check_tests.py).
start=$SECONDS
if ! verdict="$("$PYTHON" scripts/gpu_check_tests.py --out "$OUT" $TESTS 2>&1)"; then
  echo "gpu-check: FAILED  test suite: $(tail -n 1 <<<"$verdict"); see $OUT/tests.log" | tee -a "$summary" >&2
  exit 1
fi
echo "gpu-check: ok      test suite: $verdict ($((SECONDS - start)) s)" | tee -a "$summary"

# The benchmark on this GPU.
if ! "$PYTHON" scripts/gpu_bench.py --out "$OUT/bench.json" >"$OUT/bench.log" 2>&1; then
  echo "gpu-check: FAILED  benchmark; see $OUT/bench.log" | tee -a "$summary" >&2
  exit 1
fi
tee -a "$summary" <"$OUT/bench.log"
echo "gpu-check: all passed; results in $OUT/" | tee -a "$summary"
