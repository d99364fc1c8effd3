#!/usr/bin/env python3
"""Summarize bench/results/*.json: per scenario and op, each algorithm's busbw
ratio to native at the largest size, the fraction of the link bound reached,
and auto's worst ratio over all sizes (auto must not pick a loser).

    python bench/summarize.py bench/results/*.json > bench/results/SUMMARY.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def summarize(paths: list[str]) -> str:
    lines = ["| scenario | op | size | native ms | per algorithm: ms, x native, % of bound | auto worst x native |",
             "| --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        doc = json.loads(Path(path).read_text())
        name = Path(path).stem
        rows = doc["results"]
        by: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
        for r in rows:
            by[(r["op"], r["size"])][r["algo"]] = r
        for op in dict.fromkeys(r["op"] for r in rows):
            sizes = sorted(s for (o, s) in by if o == op)
            last = by[(op, sizes[-1])]
            native = last["native"]
            parts = []
            for algo, r in last.items():
                if algo == "native":
                    continue
                bound = r.get("bound_us")
                frac = f", {bound / r['time_us']:.0%} of bound" if bound else ""
                parts.append(f"{algo}: {r['time_us'] / 1e3:.0f} ms, {r['busbw'] / native['busbw']:.2f}x{frac}")
            worst = min((by[(op, s)]["auto"]["busbw"] / by[(op, s)]["native"]["busbw"], s)
                        for s in sizes if "auto" in by[(op, s)])
            nb = native.get("bound_us")
            nfrac = f" ({nb / native['time_us']:.0%} of bound)" if nb else ""
            lines.append(f"| {name} | {op} | {sizes[-1] >> 20} MiB | {native['time_us'] / 1e3:.0f}{nfrac} | "
                         f"{'; '.join(parts)} | {worst[0]:.2f}x at {worst[1]} B |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(summarize(sys.argv[1:]))
