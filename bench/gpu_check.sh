#!/usr/bin/env bash
# The prepared check for a lent single-GPU machine (TESTBED.md), a few minutes:
# build hocc._C with CUDA/NCCL there, print what it links, then run
# bench/gpu_check.py (NCCL world of one, 8 in-process ranks on the GPU checked
# against torch, reduction kernels vs device copy, and issue 13's fault paths:
# an absent in-process rank, the NCCL watchdog, CUDA-graph capture refused,
# CuPy arrays; bench/gpu_faults.py). Results under $OUT (or /tmp).
# `bash bench/gpu_check.sh --only nccl_watchdog,capture` reruns some sections
# (the build is incremental), `--device cpu` dry-runs what the CPU can; GPU_CHECK_TIMEOUT
# bounds the python part (s).
# Uses the machine's own python3, torch (its headers and pybind11) and NCCL package: nothing is
# fetched; without ninja there, torch's build falls back to compiling one file at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hocc-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt" || true
if [ -z "${HOCC_NCCL_HOME:-}" ]; then  # nvidia-nccl-cu12 or -cu13, wherever the machine's python keeps it
  site=$($PY -c 'import site; print(" ".join(site.getsitepackages()))')
  header=$(find $site -name nccl.h -path '*nccl*' 2>/dev/null | head -1)
  [ -n "$header" ] && export HOCC_NCCL_HOME=$(dirname "$(dirname "$header")")
fi
echo "NCCL from ${HOCC_NCCL_HOME:-?}"
start=$(date +%s)
HOCC_BUILD_CUDA=1 $PY setup.py -q build_ext --inplace 2>&1 | tee "$OUT/build.log" | grep -v '^copying' || true
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -m hocc.executor | tee "$OUT/native.txt"
$PY -c 'import cupy; print("cupy", cupy.__version__, "CUDA", cupy.cuda.runtime.runtimeGetVersion())' 2>&1 | tail -1 || true
rc=0
PYTHONUNBUFFERED=1 timeout "${GPU_CHECK_TIMEOUT:-420}" $PY bench/gpu_check.py --json "$OUT/gpu_check.json" "$@" \
  2>&1 | tee "$OUT/gpu_check.log" || rc=$?
[ "$rc" = 124 ] && echo "gpu_check: timed out after ${GPU_CHECK_TIMEOUT:-420} s (a section hung: see the log)"
exit "$rc"
