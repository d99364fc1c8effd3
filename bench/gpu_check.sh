#!/usr/bin/env bash
# The prepared check for a lent single-GPU machine, under 5 minutes: build
# hocc._C there (no CUDA, NCCL or nvcc needed: CUDA tensors run through torch's
# ProcessGroupNCCL and torch's kernels) and say what it links, then run
# bench/gpu_check.py's sections (nccl_world1, inproc, device_copy, capture,
# cupy, async_work, absent, memory, paro), each in a process of its own under a time
# limit. One `VERDICT <section>: ok|FAIL|SKIP (...)` line per section, build
# included; results under $OUT (gpu_check.json rewritten after each section,
# logs beside it); exit status 1 if any section failed.
#   bash bench/gpu_check.sh                        everything, on cuda:0
#   bash bench/gpu_check.sh --only capture,cupy    some sections (the build is incremental)
#   bash bench/gpu_check.sh --device cpu           the dry run: what runs on a CPU
# GPU_CHECK_BUDGET (s, default 290 on the GPU, 1800 on the CPU) bounds the whole
# script; each section's limit shrinks to what is left. Uses the machine's python3
# (PYTHON overrides; the dry run prefers .venv's) and its torch: nothing is fetched.
# Without ninja, torch's build compiles one file at a time; this script then
# compiles hocc._C's files in parallel itself (and says so).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-/tmp/hocc-gpu-check}
mkdir -p "$OUT"
DEVICE=cuda:0
prev=
for a in "$@"; do
  [ "$prev" = --device ] && DEVICE=$a
  case $a in --device=*) DEVICE=${a#--device=} ;; esac
  prev=$a
done
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ "$DEVICE" = cpu ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
if [ "$DEVICE" = cpu ]; then BUDGET=${GPU_CHECK_BUDGET:-1800}; else BUDGET=${GPU_CHECK_BUDGET:-290}; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

[ "$DEVICE" != cpu ] && { nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv 2>&1 \
  | tee "$OUT/gpu.txt" || true; }
$PY - 2>&1 <<'EOF' | tee "$OUT/versions.txt"
import sys, torch
from torch.utils.cpp_extension import is_ninja_available
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"
print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", nccl)
try:
    import cupy
    print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
except Exception as e:  # the cupy section says so too
    print("cupy: not importable:", e)
print("ninja", "yes" if is_ninja_available() else "no")
EOF

# -- build -------------------------------------------------------------------------------------------
ninja=$(sed -n 's/^ninja //p' "$OUT/versions.txt")
start=$(date +%s)
if [ "$ninja" = yes ]; then
  $PY setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1
  rc=$?
  how="ninja, $(nproc) cores: $(grep -c '^\[[0-9]*/[0-9]*\]' "$OUT/build.log") files compiled"
else
  # torch's build without ninja compiles one file at a time: compile them in parallel here instead
  $PY - >"$OUT/build.log" 2>&1 <<'EOF'
import os, runpy, sys
from concurrent.futures import ThreadPoolExecutor
from setuptools._distutils import ccompiler

def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=False, extra_preargs=None,
            extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
    jobs = [(obj, *build[obj]) for obj in objects if obj in build]
    print(f"hocc build: compiling {len(jobs)} files in parallel", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:  # torch's per-file wrapper is _compile
        list(pool.map(lambda j: self._compile(j[0], j[1], j[2], cc_args, extra_postargs, pp_opts), jobs))
    return objects

ccompiler.CCompiler.compile = compile
sys.argv = ["setup.py", "-q", "build_ext", "--inplace"]
runpy.run_path("setup.py", run_name="__main__")
EOF
  rc=$?
  files=$(grep -o 'compiling [0-9]* files in parallel' "$OUT/build.log")
  [ -z "$files" ] && how="no ninja: nothing compiled (up to date)"
  [ -n "$files" ] && how="no ninja: $files by this script ($(nproc) cores)"
  if [ $rc != 0 ]; then  # the parallel form failed: torch's own, one file at a time
    how="no ninja: one file at a time (the parallel form failed: build-parallel.log)"
    mv "$OUT/build.log" "$OUT/build-parallel.log"
    $PY setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1
    rc=$?
  fi
fi
$PY -m hocc.executor >"$OUT/native.txt" 2>&1
native_rc=$?
if [ $rc = 0 ] && [ $native_rc != 0 ]; then  # e.g. an extension built against another torch, which looked current
  how="$how; rebuilt with --force: the extension did not load"
  $PY setup.py -q build_ext --inplace --force >>"$OUT/build.log" 2>&1
  rc=$?
  $PY -m hocc.executor >"$OUT/native.txt" 2>&1
  native_rc=$?
fi
secs=$(( $(date +%s) - start ))
grep -v '^copying' "$OUT/build.log" | tail -20
so=$(ls hocc/_C*.so 2>/dev/null | head -1)
{ echo "# NEEDED (what hocc._C itself links)"; readelf -d "$so" 2>&1 | grep NEEDED
  echo "# ldd (with what torch's libraries bring)"; ldd "$so" 2>&1; } >"$OUT/links.txt"
grep NEEDED "$OUT/links.txt"
cuda_linked=$(grep NEEDED "$OUT/links.txt" | grep -Eio 'lib(cudart|nccl|cuda|cublas)[^] ]*' | tr '\n' ' ')
via_ldd=$(sed -n '/^# ldd/,$p' "$OUT/links.txt" | grep -Eio 'lib(cudart|nccl)[^ ]*' | sort -u | tr '\n' ' ')
cat "$OUT/native.txt"
if [ $rc != 0 ]; then verdict="FAIL (setup.py exit $rc after $secs s; $how; see $OUT/build.log)"
elif [ -n "$cuda_linked" ]; then verdict="FAIL (hocc._C links ${cuda_linked% }; $secs s, $how)"
elif [ $native_rc != 0 ]; then verdict="FAIL (python -m hocc.executor exit $native_rc: $(tail -1 "$OUT/native.txt"))"
else verdict="ok ($secs s, $how; links no CUDA or NCCL library itself; ldd: ${via_ldd:-no libcudart or libnccl})"
fi
echo "VERDICT build: $verdict"
$PY -c 'import json, sys; json.dump({"verdict": sys.argv[1], "seconds": int(sys.argv[2]), "how": sys.argv[3],
        "ninja": sys.argv[4] == "yes"}, open(sys.argv[5], "w"), indent=1)' \
  "$verdict" "$secs" "$how" "$ninja" "$OUT/build.json"

# -- the sections --------------------------------------------------------------------------------------
left=$(( T0 + BUDGET - $(date +%s) ))
rc=0
timeout --kill-after=5 "$(( left > 10 ? left : 10 ))" $PY bench/gpu_check.py --json "$OUT/gpu_check.json" \
  --build-json "$OUT/build.json" --deadline "$(( T0 + BUDGET - 5 ))" "$@" 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "gpu_check: killed at the budget's end ($BUDGET s); see $OUT/gpu_check.log"
echo "gpu_check.sh: $(( $(date +%s) - T0 )) s in all; results in $OUT"
case $verdict in ok*) exit "$rc" ;; *) exit 1 ;; esac
