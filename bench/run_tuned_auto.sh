#!/usr/bin/env bash
# auto after tuning against the fastest of native, ring and ho_ring, on every
# emulated scenario at 200 Mbit/s, and on 2x4 described wrongly to hocc
# (HOCC_TOPOLOGY=2x4@nic=10gbit); then bench/tuned_report.py writes
# bench/results/tuning/README.md and its plot. Needs root; about 45 minutes on
# 2 cores; run nothing else meanwhile. ONLY=name runs one scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results/tuning}
mkdir -p "$OUT"
run() {  # name scenario [extra script args...]
  local name=$1 scenario=$2
  shift 2
  [[ -n ${ONLY:-} && $ONLY != "$name" ]] && return 0
  echo "# $name" >&2
  flock /tmp/hocc-bench.lock "$PY" bench/cluster.py "$scenario" --rate 200mbit --script bench/tuned_auto.py -- \
    --sizes "${SIZES:-4,4K,256K,4M,64M}" --json "$OUT/$name.json" "$@" | tee "$OUT/$name.txt"
}
run 2x4 2x4
run 2x4-wrong-10gbit 2x4 --topology 2x4@nic=10gbit
run 2x4-scattered 2x4-scattered
run 4x2 4x2
run 2x2x2 2x2x2
run flat8 flat8
run 3+5 3+5
"$PY" bench/tuned_report.py "$OUT"
