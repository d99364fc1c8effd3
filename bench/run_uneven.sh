#!/usr/bin/env bash
# Unequal hosts on the emulated cluster (issue 14): 3+5 and 4+4+3 at 200 Mbit/s,
# the three ops from 1 MiB to 64 MiB, native against the topology-ordered ring,
# ho_ring and auto. Needs root; wrap in `flock /tmp/hocc-bench.lock` on a shared machine.
# OUT= folder, MIN= / MAX= sizes, OPS= comma list of ops (default all), ITERS=, CHECK=.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-bench/results}"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results}
# -c 0: the check builds every rank's input in float64 on every rank (W x 8 B x S), which at 64 MiB
# and 8-11 ranks does not fit in 24 GiB; correctness is the tests' job (tests/test_collectives_uneven.py)
ARGS=(-b ${MIN:-1M} -e ${MAX:-64M} -f 4 -n ${ITERS:-3} -w 1 -c ${CHECK:-0} --op ${OPS:-all}
      --algo native,ring,ho_ring,auto)
run() {  # name scenario rate
  local name=$1 scenario=$2 rate=$3
  local cmd=("$PY" bench/cluster.py "$scenario" --rate "$rate" -- "${ARGS[@]}"
             --json "$OUT/$name.json" --plot "$OUT/$name.png" --quiet)
  echo "# $name: ${cmd[*]}" >&2
  { echo '```'; echo "\$ ${cmd[*]}"; "${cmd[@]}"; echo '```'; } > "$OUT/$name.md"
}
only=${1:-all}
[[ $only == all || $only == 3+5 ]] && run uneven-3+5-200mbit 3+5 200mbit
[[ $only == all || $only == 4+4+3 ]] && run uneven-4+4+3-200mbit 4+4+3 200mbit
exit 0
