"""Large calls, two commits side by side in one run: a fixed set of scenarios
on the emulated cluster (bench/cluster.py), each timed by bench/per_host_run.py
(torch processes per host namespace, gloo's own call interleaved, the slowest
rank) for the base commit and for this checkout, alternating, --rounds times.
Prints ho_ring's time per commit, their ratio, each against gloo's own call,
and the fraction of the NIC bound; --json keeps every row.

    sudo .venv/bin/python bench/regression.py --base 1c10fcd
    sudo .venv/bin/python bench/regression.py --base 1c10fcd --only flat8 --rounds 1

The base is checked out as a git worktree under build/regression/<commit> and
its hocc._C built there once, against this venv's torch; its ranks import it
through PYTHONPATH. Needs root (network namespaces), as bench/cluster.py."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from hocc.bench.emulated import SCENARIOS
from hocc.plan.volumes import link_bound
from hocc.topology import parse_spec

ROOT = Path(__file__).resolve().parents[1]

# (scenario, bytes per call, ops): the calls whose regression issue 36 names
CHECKS = [
    ("flat8", "16M", "all_reduce"),
    ("2x4", "64M", "all_reduce,all_gather,reduce_scatter"),
    ("3+5", "64M", "all_reduce"),
    ("4+4+3", "64M", "all_gather"),
]
RATE = "200mbit"


def worktree(commit: str) -> Path:
    """The base commit's tree with its hocc._C built (once)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit], check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = ROOT / "build" / "regression" / sha[:12]
    if not (tree / "hocc").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), sha], check=True)
    if not list((tree / "hocc").glob("_C*.so")):
        print(f"# building hocc._C of {sha[:12]} in {tree}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       stdout=subprocess.DEVNULL)
    return tree


def run(scenario: str, size: str, ops: str, tree: Path, tag: str, iters: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "bench" / "cluster.py"), scenario, "--rate", RATE, "--script",
           str(ROOT / "bench" / "per_host_run.py"), "--", "--size", size, "--ops", ops, "--algos", "ho_ring",
           "--iters", str(iters), "--tag", tag]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"regression.py: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        r["scenario"] = scenario
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit to compare with (e.g. 1c10fcd)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each commit, alternating (default 2)")
    p.add_argument("--iters", type=int, default=3, help="timed calls per run (after one warm-up)")
    p.add_argument("--only", help="comma list of scenarios from the fixed set")
    p.add_argument("--json", help="write every row here")
    a = p.parse_args()
    checks = [c for c in CHECKS if not a.only or c[0] in a.only.split(",")]
    trees = {"base": worktree(a.base), "head": ROOT}
    rows: list[dict] = []
    for scenario, size, ops in checks:
        for rnd in range(a.rounds):
            for tag in ("base", "head"):
                print(f"# {scenario} {size} {ops}: {tag}, round {rnd + 1}", file=sys.stderr, flush=True)
                rows += run(scenario, size, ops, trees[tag], tag, a.iters)
    if a.json:
        Path(a.json).write_text(json.dumps({"base": a.base, "rows": rows}, indent=1))

    def med(scenario: str, op: str, tag: str, way: str) -> float:
        return statistics.median(r["median_s"] for r in rows
                                 if (r["scenario"], r["op"], r["tag"], r["way"]) == (scenario, op, tag, way))

    print(f"| scenario | op | size | ho_ring at {a.base} | ho_ring here | here / base | x gloo at base | "
          "x gloo here | NIC bound here |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for scenario, size, ops in checks:
        spec = SCENARIOS[scenario].spec(RATE, "100mbit")
        for op in ops.split(","):
            nbytes = next(r["size"] for r in rows if r["scenario"] == scenario and r["op"] == op)
            base, head = med(scenario, op, "base", "ho_ring"), med(scenario, op, "head", "ho_ring")
            gb, gh = med(scenario, op, "base", "gloo"), med(scenario, op, "head", "gloo")
            bound = link_bound(op, nbytes, parse_spec(spec))
            frac = f"{bound / head:.0%}" if bound else "- (one host)"
            print(f"| {scenario} | {op} | {size} | {base * 1e3:.1f} ms | {head * 1e3:.1f} ms | {head / base:.2f} | "
                  f"{gb / base:.2f}x | {gh / head:.2f}x | {frac} |")


if __name__ == "__main__":
    main()
