#!/usr/bin/env bash
# Regenerates bench/results/: every emulated scenario, the three ops, 64 KiB to
# 64 MiB, native against ho_ring and auto (ring too where placement matters).
# Needs root. Takes about 25 minutes on 2 cores; run nothing else meanwhile.
# OUT=dir MIN=64M (for example) writes a shorter run elsewhere, to compare with bench/compare_runs.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results}
ARGS=(-b ${MIN:-64K} -e ${MAX:-64M} -f 4 -n 3 -w 1 -c ${CHECK:-1} --op all)
run() {  # name scenario rate algos
  local name=$1 scenario=$2 rate=$3 algos=$4
  local cmd=("$PY" bench/cluster.py "$scenario" --rate "$rate" -- "${ARGS[@]}" --algo "$algos"
             --json "$OUT/$name.json" --plot "$OUT/$name.png" --quiet)
  echo "# $name: ${cmd[*]}" >&2
  { echo '```'; echo "\$ ${cmd[*]}"; "${cmd[@]}"; echo '```'; } > "$OUT/$name.md"
}
only=${1:-all}
[[ $only == all || $only == 2x4 ]] && run 2x4-200mbit 2x4 200mbit native,ring,ho_ring,auto
[[ $only == all || $only == 2x4-scattered ]] && run 2x4-scattered-200mbit 2x4-scattered 200mbit native,ring,ho_ring,auto
[[ $only == all || $only == 4x2 ]] && run 4x2-200mbit 4x2 200mbit native,ho_ring,auto
[[ $only == all || $only == 2x2x2 ]] && run 2x2x2-200mbit 2x2x2 200mbit native,ho_ring,auto
[[ $only == all || $only == flat8 ]] && run flat8 flat8 200mbit native,ho_ring,auto
[[ $only == all || $only == 2x4-1gbit ]] && run 2x4-1gbit 2x4 1gbit native,ho_ring,auto
exit 0
