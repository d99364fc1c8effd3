"""`hocc paro advise`: which PaRO-DP strategy to train with. Ranks the
strategies that fit in memory by predicted communication time per optimizer
step (hocc's planner on the topology), with each one's memory per rank, and
says why the top one wins.

    hocc paro advise --params 7e9 --topology 64x8@nic=100gbit,host=2400gbit --memory 80GB --accum 8 --backend nccl
    hocc paro advise --params 50e6 --topology 2x4@nic=200mbit --memory 2GB --accum 4
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from hocc.paro.advisor import evaluate, explain, table
from hocc.paro.memory import StateBytes
from hocc.topology import parse_spec

_MEM = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.I)


def parse_memory(text: str) -> float:
    """'80GB' (10^9), '80GiB' (2^30), '8e10' (bytes)."""
    m = _MEM.match(text)
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"cannot parse memory {text!r}; write e.g. 80GB, 80GiB or 8e10 (bytes)")
    power = "kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0
    return float(m.group(1)) * ((1024 if m.group(3) else 1000) ** power)


def parse_bytes(text: str) -> StateBytes:
    parts = text.split(",")
    if len(parts) != 3:
        raise ValueError(f"--bytes takes three numbers, params,grads,optim (e.g. 2,2,12), got {text!r}")
    try:
        p, g, o = (float(x) for x in parts)
    except ValueError:
        raise ValueError(f"--bytes takes three numbers, params,grads,optim (e.g. 2,2,12), got {text!r}") from None
    return StateBytes(p, g, o)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="paro_cmd", required=True)
    a = sub.add_parser("advise", help="rank the PaRO strategies that fit in memory", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--params", required=True, type=float, help="parameters of the model, e.g. 7e9")
    a.add_argument("--topology", required=True, help="spec ('2x4@nic=200mbit', '64x8') or a topology file")
    a.add_argument("--memory", help="memory per rank for model states, e.g. 80GB (default: no limit)")
    a.add_argument("--reserve", default="0", help="memory per rank kept for activations etc., e.g. 20GB")
    a.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step (default 1)")
    a.add_argument("--bytes", default="2,2,12", help="bytes per parameter of params,grads,optim (default 2,2,12: "
                                                     "mixed-precision Adam)")
    a.add_argument("--elem-size", type=int, default=2, help="bytes per element on the wire (default 2, bf16)")
    a.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="whose costs the planner uses without a calibrated file (see hocc plan)")
    a.add_argument("--strategies", help="comma list to compare (default: all 14 that run)")
    a.add_argument("--json", metavar="FILE", help="also write the ranking as JSON ('-' for stdout)")


def run(a: argparse.Namespace) -> int:
    topo = parse_spec(a.topology)
    budget = parse_memory(a.memory) if a.memory else None
    names = tuple(s.strip().upper() for s in a.strategies.split(",")) if a.strategies else None
    opts = evaluate(int(a.params), topo, a.accum, budget, parse_bytes(a.bytes), a.elem_size, a.backend, names,
                    parse_memory(a.reserve))
    print(f"# PaRO-DP on {topo.shape()} ({topo.world_size} ranks), {a.params:.4g} parameters, accum {a.accum}, "
          f"memory {a.memory or 'unlimited'}, backend {a.backend}; * = a strategy the paper names")
    print(table(opts))
    print()
    print(explain(opts, budget))
    if a.json:
        rows = [{"strategy": o.strategy, "fits": o.fits, "comm_seconds": o.seconds, **o.memory.as_dict(),
                 "memory_total": o.memory.total,
                 "micro": o.comm.per("micro"), "step": o.comm.per("step"),
                 "collectives": [{"op": p.coll.op, "where": p.coll.where, "when": p.coll.when,
                                  "state": p.coll.state, "count": p.count, "algo": p.algo, "seconds": p.seconds,
                                  "intra_bytes": p.intra_bytes, "inter_bytes": p.inter_bytes}
                                 for p in o.comm.items]} for o in opts]
        text = json.dumps(rows, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="hocc paro")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
