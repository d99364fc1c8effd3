#!/usr/bin/env bash
# Regenerates bench/results/: every emulated scenario, the three ops, native against ho_ring and auto
# (ring too where placement matters): the six uniform ones from 64 KiB to 64 MiB, then the two with
# unequal hosts (3+5, 4+4+3) from 1 MiB through bench/run_uneven.sh. Each writes NAME.md (its command,
# then hocc-bench's table), NAME.json and NAME.png. At the end, from the JSONs: SUMMARY.md
# (bench/summarize.py, with the command, code version, dates and machine), uneven-summary.md
# (bench/uneven_summary.py) and model.md with its plots (bench/model_report.py, only when OUT is
# bench/results, where it reads and writes).
#
#   sudo bash bench/run_results.sh            # everything: about 35 minutes on 2 cores (25 for the first six)
#   sudo bash bench/run_results.sh 2x4        # one scenario (flat8 2x4 2x4-scattered 4x2 2x2x2 2x4-1gbit 3+5 4+4+3);
#                                             # SUMMARY.md marks the others as earlier runs
#
# Needs root. Run nothing else meanwhile (wrap it in `flock /tmp/hocc-bench.lock` on a shared machine).
# `sudo OUT=dir MIN=64M bash bench/run_results.sh` (for example) writes a shorter run elsewhere, to compare
# with bench/compare_runs.py; MAX= and CHECK= (hocc-bench's -c) are read too, and PY= (the venv's python).
set -euo pipefail
cd "$(dirname "$0")/.."
given=""  # the settings given, as SUMMARY.md's command line shows them
for v in CHECK MAX MIN OUT PY; do [[ -n ${!v:-} ]] && given+="$v=${!v} "; done
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
ARGS=(-b ${MIN:-64K} -e ${MAX:-64M} -f 4 -n 3 -w 1 -c ${CHECK:-1} --op all)
SCENARIOS=(flat8 2x4 2x4-scattered 4x2 2x2x2 2x4-1gbit 3+5 4+4+3)
only=${1:-all}
if [[ $only != all && " ${SCENARIOS[*]} " != *" $only "* ]]; then
  echo "run_results.sh: unknown scenario '$only'; use one of: ${SCENARIOS[*]} (or nothing for all)" >&2
  exit 2
fi

# git as the user who ran sudo: root gets "dubious ownership" in a user's repository, and must not
# leave a root-owned .git/index behind
git_() { if [[ -n ${SUDO_USER:-} ]]; then sudo -u "$SUDO_USER" git "$@"; else git "$@"; fi; }
code_version() {
  local v n
  v=$(git_ describe --always --dirty --abbrev=12 2>/dev/null) || { echo "unknown (not a git checkout)"; return; }
  n=$(git_ status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  [[ $n -gt 0 ]] && v="$v ($n tracked files modified against the commit)"
  echo "$v"
}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
code_at_start=$(code_version)
echo "# bench/run_results.sh $only: code $code_at_start, started $started" >&2

run() {  # key name scenario rate algos
  local key=$1 name=$2 scenario=$3 rate=$4 algos=$5
  [[ $only == all || $only == "$key" ]] || return 0
  local cmd=("$PY" bench/cluster.py "$scenario" --rate "$rate" -- "${ARGS[@]}" --algo "$algos"
             --json "$OUT/$name.json" --plot "$OUT/$name.png" --quiet)
  echo "# $name: ${cmd[*]}" >&2
  { echo '```'; echo "\$ ${cmd[*]}"; "${cmd[@]}"; echo '```'; } > "$OUT/$name.md"
}
run_uneven() {  # scenario: bench/run_uneven.sh's run (1 MiB up; -c 0: the check's float64 copies of every
  # rank's input do not fit in memory at 64 MiB on 8-11 ranks, and correctness is the tests' job)
  [[ $only == all || $only == "$1" ]] || return 0
  OUT=$OUT PY=$PY MIN=${MIN:-1M} MAX=${MAX:-64M} CHECK=0 bash bench/run_uneven.sh "$1"
}
run flat8 flat8 flat8 200mbit native,ho_ring,auto
run 2x4 2x4-200mbit 2x4 200mbit native,ring,ho_ring,auto
run 2x4-scattered 2x4-scattered-200mbit 2x4-scattered 200mbit native,ring,ho_ring,auto
run 4x2 4x2-200mbit 4x2 200mbit native,ho_ring,auto
run 2x2x2 2x2x2-200mbit 2x2x2 200mbit native,ho_ring,auto
run 2x4-1gbit 2x4-1gbit 2x4 1gbit native,ho_ring,auto
run_uneven 3+5
run_uneven 4+4+3

# what the JSONs do not record: the command, the code version that ran (at the start and the end, in
# case the tree changed meanwhile), when this started; summarize.py adds the machine and the dates
code_at_end=$(code_version)
code=$code_at_start
[[ $code_at_end != "$code_at_start" ]] && code="$code_at_start at the start, $code_at_end at the end (changed during the run)"
command="sudo ${given}bash bench/run_results.sh${1:+ $1}"
names=(flat8 2x4-200mbit 2x4-scattered-200mbit 4x2-200mbit 2x2x2-200mbit 2x4-1gbit uneven-3+5-200mbit
       uneven-4+4+3-200mbit)
jsons=()
for n in "${names[@]}"; do [[ -f $OUT/$n.json ]] && jsons+=("$OUT/$n.json"); done
"$PY" bench/summarize.py --command "$command" --code "$code" --since "$started" --machine \
  -o "$OUT/SUMMARY.md" "${jsons[@]}"
echo "# wrote $OUT/SUMMARY.md" >&2
uneven=()
for n in uneven-3+5-200mbit uneven-4+4+3-200mbit; do [[ -f $OUT/$n.json ]] && uneven+=("$OUT/$n.json"); done
if [[ ${#uneven[@]} -gt 0 ]]; then
  "$PY" bench/uneven_summary.py "${uneven[@]}" > "$OUT/uneven-summary.md" \
    && echo "# wrote $OUT/uneven-summary.md" >&2 \
    || echo "# bench/uneven_summary.py failed: $OUT/uneven-summary.md is not current" >&2
fi
if [[ $OUT == bench/results ]]; then
  "$PY" bench/model_report.py > /dev/null \
    && echo "# wrote $OUT/model.md and model-*.png" >&2 \
    || echo "# bench/model_report.py failed: $OUT/model.md is not current" >&2
fi
exit 0
