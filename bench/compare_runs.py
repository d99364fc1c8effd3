"""Side by side: each scenario's ratio to native (and fraction of the link
bound) at one size, in two sets of hocc-bench JSON runs, e.g. the results
committed before a change and a rerun after it.

    python bench/compare_runs.py --size 64M --before bench/results --after bench/results/one-executor \
        --names 2x4-200mbit,flat8 -o bench/results/one-executor/SUMMARY.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hocc.bench.report import load_json
from hocc.bench.sizes import parse_size


def _rows(path: Path, size: int) -> dict[tuple[str, str], dict]:
    if not path.exists():
        return {}
    return {(r["op"], r["algo"]): r for r in load_json(path)[1] if r["size"] == size}


def _cell(rows: dict[tuple[str, str], dict], op: str, algo: str) -> str:
    r, base = rows.get((op, algo)), rows.get((op, "native"))
    if r is None or base is None:
        return "-"
    ratio = base["time_us"] / r["time_us"]
    bound = f", {r['bound_us'] / r['time_us']:.0%} of bound" if r.get("bound_us") else ""
    ran = f" ({r['ran']})" if r.get("ran") and r["ran"] != algo else ""
    return f"{ratio:.2f}x{ran}{bound}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64M")
    p.add_argument("--before", required=True, help="folder of the earlier runs' NAME.json")
    p.add_argument("--after", required=True, help="folder of the later runs' NAME.json")
    p.add_argument("--names", required=True, help="comma list of run names (file stems)")
    p.add_argument("--algos", default="ho_ring,auto")
    p.add_argument("-o", "--output", help="write the markdown table here (default: stdout)")
    a = p.parse_args()
    size = parse_size(a.size)
    algos = a.algos.split(",")
    lines = ["| run | op | algo | before: x native | after: x native |", "| --- | --- | --- | --- | --- |"]
    for name in a.names.split(","):
        before, after = _rows(Path(a.before) / f"{name}.json", size), _rows(Path(a.after) / f"{name}.json", size)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for algo in algos:
                lines.append(f"| {name} | {op} | {algo} | {_cell(before, op, algo)} | {_cell(after, op, algo)} |")
    text = "\n".join(lines) + "\n"
    if a.output:
        Path(a.output).write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
