#!/usr/bin/env bash
# `make cuda-check`: compile every CUDA source of cuda_ext/ for sm_80 and sm_90 with the machine's nvcc.
# The .cu files include only cuda_ext's own headers and CUDA's, so no CUDA build of torch is needed; the thin
# torch-facing *_cuda.cpp files need one (docs/cuda.md says how to build the full extension).
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

# The torch-facing *_cuda.cpp files need a CUDA build of torch to compile for real. Short of that, check them with the
# host compiler against the installed torch's headers (syntax and template instantiation, no code generated): the CPU
# wheel ships ATen's CUDA headers but not the cuBLAS/cuSOLVER/cuSPARSE headers they include, so placeholder
# declarations stand in for those. Skipped when no Python with torch is found.
PYTHON="${PYTHON:-.venv/bin/python}"
host_checked=0
if torch_includes="$("$PYTHON" -c 'import sysconfig, torch.utils.cpp_extension as c
print(" ".join("-I" + p for p in [*c.include_paths(), sysconfig.get_paths()["include"]]))' 2>/dev/null)"; then
  stubs="$out/stubs"
  mkdir -p "$stubs/c10/cuda/impl"
  : >"$stubs/c10/cuda/impl/cuda_cmake_macros.h"
  printf '#pragma once\ntypedef struct cublasContext* cublasHandle_t;\ntypedef int cublasStatus_t;\n' >"$stubs/cublas_v2.h"
  printf '#pragma once\ntypedef struct cublasLtContext* cublasLtHandle_t;\n' >"$stubs/cublasLt.h"
  printf '#pragma once\ntypedef struct cusparseContext* cusparseHandle_t;\ntypedef int cusparseStatus_t;\n' >"$stubs/cusparse.h"
  printf '#pragma once\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\ntypedef int cusolverStatus_t;\n' >"$stubs/cusolverDn.h"
  printf '#pragma once\n#include "cusolverDn.h"\n' >"$stubs/cusolver_common.h"
  cuda_top="$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')"  # nvcc's own toolkit
  for src in cuda_ext/*_cuda.cpp; do
    # shellcheck disable=SC2086  # torch_includes is a list of -I flags
    if "${CXX:-g++}" -std=c++17 -Wno-c++20-extensions -fsyntax-only -DWITH_CUDA -I"$stubs" $torch_includes -I"$cuda_top/include" -Icuda_ext \
        "$src"; then
      echo "cuda-check: ok      $src (host compiler, syntax only)"
      host_checked=$((host_checked + 1))
    else
      echo "cuda-check: FAILED  $src" >&2
      failed=1
    fi
  done
else
  echo "cuda-check: the *_cuda.cpp host check is SKIPPED — no torch found by $PYTHON (set PYTHON=...)"
fi
if [[ $failed -ne 0 ]]; then
  echo "cuda-check: FAILED — see the compiler errors above" >&2
  exit 1
fi
echo "cuda-check: all ${#sources[@]} CUDA sources compile for sm_80 and sm_90 and $host_checked torch-facing sources" \
  "pass the host check (compiled only; nothing was run)"
