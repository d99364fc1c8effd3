"""Output in nccl-tests' shape (table and footer), CSV, JSON and a PNG plot."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hocc.bench.runner import Row

SCHEMA = "hocc-bench/1"
FIELDS = ["op", "size", "count", "dtype", "redop", "algo", "ran", "time_us", "algbw", "busbw", "wrong", "spread",
          "skew_us", "late_us", "late_rank", "trial_calls", "trial_s"]


def _by_key(rows: Sequence[Row]) -> dict[tuple[str, int], dict[str, Row]]:
    out: dict[tuple[str, int], dict[str, Row]] = {}
    for r in rows:
        out.setdefault((r.op, r.size), {})[r.algo] = r
    return out


def table(rows: Sequence[Row], algos: Sequence[str], bounds: dict[tuple[str, int], float] | None = None) -> str:
    """One line per (op, size); per algorithm: time, algbw, busbw, #wrong."""
    bounds = bounds or {}
    buf = io.StringIO()
    head1 = f"#{'':>12} {'':>12} {'':>8} {'':>6} "
    head2 = f"#{'size':>12} {'count':>12} {'type':>8} {'redop':>6} "
    head3 = f"#{'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} "
    for a in algos:
        head1 += f"{a:^40}"
        head2 += f" {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}  "
        head3 += f" {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}  "
    if bounds:
        head1 += f"{'link bound':^12}"
        head2 += f" {'time':>10}"
        head3 += f" {'(us)':>10}"
    current_op = None
    for (op, size), per in _by_key(rows).items():
        if op != current_op:
            current_op = op
            buf.write(f"#\n# {op}\n{head1.rstrip()}\n{head2.rstrip()}\n{head3.rstrip()}\n")
        first = next(iter(per.values()))
        line = f" {size:>12} {first.count:>12} {first.dtype:>8} {first.redop:>6} "
        for a in algos:
            r = per.get(a)
            if r is None:
                line += f" {'-':>10} {'-':>8} {'-':>8} {'-':>7}  "
            else:
                mark = "" if r.ran == r.algo else f"({r.ran[0]})"
                line += f" {r.time_us:>10.1f} {r.algbw:>8.4f} {r.busbw:>8.4f} {r.wrong:>7}{mark:<2}"
        if (op, size) in bounds:
            line += f" {bounds[(op, size)] * 1e6:>10.1f}"
        buf.write(line.rstrip() + "\n")
    return buf.getvalue()


def footer(rows: Sequence[Row], algos: Sequence[str], bounds: dict[tuple[str, int], float] | None = None) -> str:
    """Average bus bandwidth per algorithm, each algorithm's ratio to native,
    and (where known) the fraction of the link bound reached at the largest size."""
    bounds = bounds or {}
    nwrong = sum(r.wrong for r in rows)
    lines = [f"# Out of bounds values : {nwrong} {'OK' if not nwrong else 'FAILED'}"]
    for a in algos:
        bw = [r.busbw for r in rows if r.algo == a]
        if bw:
            lines.append(f"# Avg bus bandwidth    : {statistics.mean(bw):.4f} GB/s  [{a}]")
    keyed = _by_key(rows)
    if "native" in algos:
        for a in algos:
            if a == "native":
                continue
            for op in dict.fromkeys(r.op for r in rows):
                ratios = [per[a].busbw / per["native"].busbw for (o, _), per in keyed.items()
                          if o == op and a in per and "native" in per and per["native"].busbw > 0]
                if ratios:
                    largest = max(s for (o, s) in keyed if o == op)
                    last = keyed[(op, largest)]
                    at_max = last[a].busbw / last["native"].busbw if last["native"].busbw else 0.0
                    lines.append(f"# {a} / native busbw  : {op:<15} mean {statistics.mean(ratios):.2f}x, "
                                 f"at {largest} B {at_max:.2f}x")
    for (op, size), per in keyed.items():
        if (op, size) in bounds and size == max(s for (o, s) in keyed if o == op):
            fr = ", ".join(f"{a} {bounds[(op, size)] / (per[a].time_us * 1e-6):.0%}" for a in algos
                           if a in per and per[a].time_us > 0)
            lines.append(f"# fraction of link bound at {size} B, {op}: {fr}")
    return "\n".join(lines) + "\n"


def skew_table(rows: Sequence[Row]) -> str:
    """hocc-bench --skew: per (op, size, algo), how much later than the first rank the latest began a call (median
    over iterations), the latest rank, and every rank's mean lateness."""
    rows = [r for r in rows if r.late_us is not None]
    if not rows:
        return ""
    lines = ["# arrival skew (--skew): per timed call, each rank's start after the first rank's, in us",
             f"#{'op':>15} {'size':>12} {'algo':>8} {'skew':>10} {'latest':>7}  per-rank mean lateness"]
    for r in rows:
        per = " ".join(f"{x:.0f}" for x in r.late_us or [])
        lines.append(f" {r.op:>15} {r.size:>12} {r.algo:>8} {r.skew_us or 0:>10.1f} {r.late_rank:>7}  {per}")
    return "\n".join(lines) + "\n"


def trials_table(rows: Sequence[Row]) -> str:
    """auto's first calls of each size: the calls before its bucket was decided and their seconds (slowest
    rank), and what it runs from then on (the main table's auto column times that)."""
    rows = [r for r in rows if r.trial_calls is not None]
    if not rows:
        return ""
    lines = ["# auto's trials: calls of the size before auto decided it (0: the model settled it, nothing measured)",
             f"#{'op':>15} {'size':>12} {'calls':>6} {'seconds':>9} {'then ran':>9}"]
    for r in rows:
        lines.append(f" {r.op:>15} {r.size:>12} {r.trial_calls:>6} {r.trial_s or 0:>9.3f} {r.ran:>9}")
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    for r in rows:
        d = r.to_dict()
        if d["late_us"] is not None:  # one cell: the ranks' lateness separated by spaces
            d["late_us"] = " ".join(f"{x:.1f}" for x in d["late_us"])
        w.writerow(d)
    return buf.getvalue()


def to_json(rows: Sequence[Row], meta: dict[str, Any], bounds: dict[tuple[str, int], float] | None = None) -> str:
    bounds = bounds or {}
    results = []
    for r in rows:
        d = r.to_dict()
        b = bounds.get((r.op, r.size))
        d["bound_us"] = None if b is None else b * 1e6
        results.append(d)
    return json.dumps({"schema": SCHEMA, "meta": meta, "results": results}, indent=1)


def load_json(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A file to_json wrote: (meta, results), each result Row.to_dict() with bound_us. ValueError, naming the
    file, for anything else (bench/ reads folders that hold other JSON too)."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a hocc-bench sweep ({SCHEMA})")
    return doc["meta"], doc["results"]


def plot(rows: Sequence[Row], algos: Sequence[str], path: str, title: str, world: int,
         bounds: dict[tuple[str, int], float] | None = None) -> None:
    """busbw against size, one panel per op, one line per algorithm, and the
    link bound (as the busbw it allows) where known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hocc.bench.collectives import bandwidths

    bounds = bounds or {}
    ops = list(dict.fromkeys(r.op for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        for a in algos:
            pts = sorted((r.size, r.busbw) for r in rows if r.op == op and r.algo == a)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=a)
        bpts = sorted((s, bandwidths(op, s, t, world)[1]) for (o, s), t in bounds.items() if o == op)
        if bpts:
            ax.plot([p[0] for p in bpts], [p[1] for p in bpts], "k--", label="link bound")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(op)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
