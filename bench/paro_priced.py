#!/usr/bin/env python3
"""The guideline's predicted step time of each PaRO strategy against the
step time bench/paro_bench.py measured, and whether it ranks them as measured.

    python bench/paro_priced.py --json paro.json --topology 2x4@nic=200mbit --out priced.md

For every strategy entry of the JSON (plain names: over hocc's calls, with
overlap), the prediction is `hocc.paro.advisor.evaluate`'s seconds per step
for the same model (TinyGPT of the JSON's args, its blocks as units), the
same accumulation, fp32 on the wire, and the measured compute: the `local`
entry's step over the micro-steps, twice: with the guideline's overlap
(`--overlap 1`: the shorter of a micro-step's compute and communication
hidden) and with none (`--overlap 0`: the two added, as on ranks that share
their cores with their communication). Writes a markdown table (measured,
both predictions, the rank of each) and Spearman's rank correlation of each
with the measured ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties averaged."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def predicted(res: dict[str, Any], topology: str, overlap: float) -> dict[str, float]:
    from tiny_gpt import build_model

    from hocc.paro import all_strategies
    from hocc.paro.advisor import evaluate
    from hocc.topology import parse_spec

    a = res["args"]
    model = build_model(a["vocab"], a["dim"], a["layers"], a["heads"], a["seq"])
    units = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    names = tuple(s.name for s in all_strategies() if s.name in res["median_s"])
    compute = res["median_s"]["local"] / a["accum"]
    opts = evaluate(res["numel"], parse_spec(topology), a["accum"], elem_size=4, strategies=names, units=units,
                    compute_s=compute, overlap=overlap)
    return {o.strategy: o.seconds for o in opts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="bench/paro_bench.py's --json output (with a 'local' entry)")
    p.add_argument("--topology", required=True, help="the cluster it ran on, e.g. 2x4@nic=200mbit")
    p.add_argument("--out", help="write the markdown here")
    a = p.parse_args()
    with open(a.json) as f:
        res = json.load(f)
    if "local" not in res["median_s"]:
        raise SystemExit("the run needs a 'local' entry (the compute alone)")
    hidden, added = predicted(res, a.topology, 1.0), predicted(res, a.topology, 0.0)
    names = sorted(hidden, key=lambda n: res["median_s"][n])
    meas = [res["median_s"][n] for n in names]
    rm, rh, ra = ranks(meas), ranks([hidden[n] for n in names]), ranks([added[n] for n in names])
    lines = ["| strategy | measured s/step | predicted, overlap 1 | rank | predicted, overlap 0 | rank | "
             "measured / predicted (overlap 0) | rank measured |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, n in enumerate(names):
        lines.append(f"| {n} | {meas[i]:.3f} | {hidden[n]:.3f} | {rh[i]:g} | {added[n]:.3f} | {ra[i]:g} | "
                     f"{meas[i] / added[n]:.2f} | {rm[i]:g} |")
    rho_h = spearman(meas, [hidden[n] for n in names])
    rho_a = spearman(meas, [added[n] for n in names])
    lines += ["", f"Spearman's rank correlation with the measured ranking over {len(names)} strategies: "
              f"{rho_h:.3f} with overlap 1, {rho_a:.3f} with overlap 0. Compute (the `local` entry): "
              f"{res['median_s']['local']:.3f} s per step of {res['args']['accum']} micro-steps.", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
