#!/usr/bin/env bash
# The three planted faults of bench/planted_faults.py on the emulated 4x2
# cluster (root; bench/cluster.py), each read by `hocc trace` from the dumps
# alone: the report (markdown), the analysis (JSON) and the timelines (PNG)
# go to bench/results/recorder/ (or $1). FAULTS="stop" runs only those named.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/recorder}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
for fault in ${FAULTS:-busy stop slow-nic}; do
  dir=$(mktemp -d)
  extra=()
  if [ "$fault" = slow-nic ]; then extra=(--host-rate 2=50mbit); fi
  echo "# $fault: bench/cluster.py 4x2 ${extra[*]} --script bench/planted_faults.py -- --fault $fault --dir DIR --calls 12" >&2
  flock /tmp/hocc-bench.lock "$PY" bench/cluster.py 4x2 "${extra[@]}" --port 29681 \
    --script bench/planted_faults.py -- --fault "$fault" --dir "$dir" --calls 12 >&2
  src=$dir
  if [ "$fault" = stop ]; then src=$dir/at-failure; fi   # the dumps as they were when the survivors failed
  {
    echo "<!-- bench/planted_report.sh: bench/cluster.py 4x2 ${extra[*]} --script bench/planted_faults.py -- --fault $fault --calls 12; hocc trace DIR -->"
    echo '```'
    "$PY" -m hocc.tools.cli trace "$src" --plot "$OUT/$fault.png" --json "$OUT/$fault.json" | grep -v '^# wrote'
    echo '```'
  } > "$OUT/$fault.md"
  rm -rf "$dir"
done
