#!/usr/bin/env bash
# `make level-check [LEVEL=v3]`: the kernels' tests (tests/ops) on the CPU loops of a lower x86-64 level than this
# CPU's. The extension's hot loops are compiled per level (AVX-512, AVX2, baseline: cuda_ext/cpu_isa.h) and the CPU
# runs the highest it supports, so a test machine with AVX-512 would never run the others. Here a copy of the working
# tree is built with DENSECNN_CPU_LEVEL=LEVEL, which leaves the levels above LEVEL out, and the tests run on it.
set -euo pipefail
cd "$(dirname "$0")/.."
level="${1:-v3}"
python="$(pwd)/.venv/bin/python"
expected=$(case "$level" in v3) echo x86-64-v3 ;; baseline) echo x86-64 ;; *) echo "" ;; esac)
if [[ -z "$expected" ]]; then
  echo "level-check: LEVEL=$level is not a level below this CPU's; use v3 or baseline" >&2
  exit 2
fi

copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
# the working tree's files, tracked and untracked but not ignored; a tracked file deleted in the tree is skipped
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' file; do if [[ -e "$file" ]]; then printf '%s\0' "$file"; fi; done |
  xargs -0 cp --parents -t "$copy"
cd "$copy"
echo "level-check: building the extension for $level in $copy"
DENSECNN_CPU_LEVEL="$level" "$python" setup.py -q build_ext --inplace >build.log 2>&1 || { tail -40 build.log; exit 1; }
runs=$(PYTHONPATH="$copy" "$python" -c "import densecnn.ops.ext, torch; print(torch.ops.densecnn.cpu_isa())")
if [[ "$runs" != "$expected" ]]; then
  echo "level-check: FAILED — the copy's kernels run $runs, not $expected" >&2
  exit 1
fi
echo "level-check: kernels run $runs"
PYTHONPATH="$copy" "$python" -m pytest -q -n 2 -p no:cacheprovider tests/ops
