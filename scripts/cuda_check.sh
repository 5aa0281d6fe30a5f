#!/usr/bin/env bash
# `make cuda-check`: compile every CUDA source of cuda_ext/ for sm_80 and sm_90 with the machine's nvcc.
# The .cu files include only cuda_ext's own headers and CUDA's, so no CUDA build of torch is needed; the thin
# torch-facing *_cuda.cpp files need one (README "Kernels (cuda_ext)" says how to build the full extension).
# Nothing here runs a kernel: there is no GPU on the build machines.
set -euo pipefail
cd "$(dirname "$0")/.."

NVCC="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then
  NVCC=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$NVCC" ]]; then
  echo "cuda-check: SKIPPED — nvcc not found (set NVCC=/path/to/nvcc or put CUDA's bin/ on PATH)"
  exit 0
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shopt -s nullglob
sources=(cuda_ext/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "cuda-check: FAILED — no .cu files under cuda_ext/" >&2
  exit 1
fi

# The defines torch's cpp_extension passes to nvcc: the .cu files must not rely on __half/__nv_bfloat16's implicit
# conversions and operators, which the real build disables.
TORCH_NVCC_DEFINES=(-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
  -D__CUDA_NO_HALF2_OPERATORS__)

echo "cuda-check: $("$NVCC" --version | tail -n 2 | head -n 1)"
failed=0
for src in "${sources[@]}"; do
  start=$SECONDS
  if "$NVCC" -std=c++17 -O3 -Icuda_ext "${TORCH_NVCC_DEFINES[@]}" \
      -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
      -Werror all-warnings -c "$src" -o "$out/$(basename "$src").o"; then
    echo "cuda-check: ok      $src ($((SECONDS - start)) s)"
  else
    echo "cuda-check: FAILED  $src" >&2
    failed=1
  fi
done
if [[ $failed -ne 0 ]]; then
  echo "cuda-check: FAILED — see the nvcc errors above" >&2
  exit 1
fi
echo "cuda-check: all ${#sources[@]} CUDA sources compile for sm_80 and sm_90 (compiled only; nothing was run)"
