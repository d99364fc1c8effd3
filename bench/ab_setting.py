#!/usr/bin/env python3
"""A/B of one setting on the emulated cluster: hocc-bench runs with an
environment variable at each of its values in turn, round after round (a
drift of the shared machine's load hits every value alike), then a table of
each (op, size)'s median time per value and the ratio of each value to the
first. Writes each run's JSON to --out-dir/<value>-r<round>.json and what
was asked to --out-dir/ab.json; --report reads a directory of them again.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ab_setting.py 2x4 --rate 1gbit --env HOCC_MIN_CHUNK_BYTES \\
        --values 524288,65536 --rounds 3 --out-dir bench/results/chunks/2x4-1gbit -- \\
        -b 256K -e 4M -f 4 -n 20 -w 3 -c 0 -a 3 --op all --algo ho_ring
    .venv/bin/python bench/ab_setting.py --report bench/results/chunks/2x4-1gbit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from hocc.bench.report import load_json

CLUSTER = Path(__file__).parent / "cluster.py"
ORDER = "ab.json"  # what run() was asked: the variable, its values in order, the scenario and hocc-bench's args


def run(a: argparse.Namespace, bench_args: list[str]) -> None:
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / ORDER).write_text(json.dumps({"env": a.env, "values": a.values, "scenario": a.scenario,
                                               "rate": a.rate, "hocc_bench": bench_args}, indent=1))
    for r in range(1, a.rounds + 1):
        for value in a.values:
            out = a.out_dir / f"{value}-r{r}.json"
            cmd = [sys.executable, str(CLUSTER), a.scenario, "--rate", a.rate, "--", *bench_args, "--json", str(out)]
            print(f"# round {r}: {a.env}={value}", flush=True)
            subprocess.run(cmd, env={**os.environ, a.env: value}, check=True, stdout=subprocess.DEVNULL,
                           timeout=a.timeout)


def report(out_dir: Path) -> str:
    times: dict[tuple[str, int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    values: list[str] = []
    for path in sorted(out_dir.glob("*-r*.json"), key=lambda p: int(p.stem.rsplit("-r", 1)[1])):
        value = path.stem.rsplit("-r", 1)[0]
        if value not in values:
            values.append(value)
        for row in load_json(path)[1]:
            times[(row["op"], row["size"], row["algo"])][value].append(row["time_us"] / 1e3)
    if not values:
        raise SystemExit(f"no <value>-r<round>.json files in {out_dir}")
    if (out_dir / ORDER).exists():  # the values in the order asked: the first is the baseline
        asked = [str(v) for v in json.loads((out_dir / ORDER).read_text())["values"]]
        values = [v for v in asked if v in values] + [v for v in values if v not in asked]
    head = ["op", "size (B)", "algo", *(f"{v} (ms, median)" for v in values),
            *(f"{v} / {values[0]}" for v in values[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (op, size, algo), per in times.items():
        med = {v: statistics.median(per[v]) for v in values if per[v]}
        cells = [f"{med[v]:.2f} ({len(per[v])})" if v in med else "-" for v in values]
        ratios = [f"{med[v] / med[values[0]]:.3f}" if v in med and values[0] in med else "-" for v in values[1:]]
        lines.append("| " + " | ".join([op, str(size), algo, *cells, *ratios]) + " |")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", help="bench/cluster.py's scenario (2x4, 4x2, 2x2x2, ...)")
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--env", help="the environment variable to vary")
    p.add_argument("--values", type=lambda s: s.split(","), help="comma list; the first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out-dir", type=Path)
    p.add_argument("--timeout", type=float, default=900, help="seconds per hocc-bench run")
    p.add_argument("--report", type=Path, metavar="DIR", help="only print the table of DIR's runs")
    a = p.parse_args(argv)
    if a.report:
        print(report(a.report))
        return
    if not (a.scenario and a.env and a.values and a.out_dir and bench_args):
        p.error("a run needs a scenario, --env, --values, --out-dir and hocc-bench's arguments after --")
    run(a, bench_args)
    print(report(a.out_dir))


if __name__ == "__main__":
    main()
