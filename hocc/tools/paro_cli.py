"""`hocc paro advise`: which PaRO-DP strategy to train with. Ranks the
strategies whose peak memory fits by predicted time per optimizer step
(hocc's planner on the topology; with --compute-ms, compute overlapped),
with each one's memory per rank at rest and at its peak, and says why the
top one wins and what torch offers for it.

    hocc paro advise --params 7e9 --units 32 --topology 64x8@nic=100gbit,host=2400gbit --memory 80GB --accum 8 \
        --backend nccl --compute-ms 400
    hocc paro advise --params 50e6 --topology 2x4@nic=200mbit --memory 2GB --accum 4
    hocc paro advise --model examples/tiny_gpt.py:build_model --topology 2x4@nic=200mbit --bytes 4,4,12,4
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from hocc.paro.advisor import evaluate, explain, table
from hocc.paro.memory import StateBytes, UnitSize
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
    want = (f"--bytes takes params,grads,optim[,master] bytes per parameter (e.g. 2,2,12 or 4,4,12,4; optim "
            f"includes the optimizer's master copy, master bytes, 4 by default), got {text!r}")
    parts = text.split(",")
    if len(parts) not in (3, 4):
        raise ValueError(want)
    try:
        nums = [float(x) for x in parts]
    except ValueError:
        raise ValueError(want) from None
    return StateBytes(*nums)


def model_units(spec: str) -> tuple[int, int, list[UnitSize]]:
    """'path/to/file.py:fn' or 'package.module:fn' -> (parameters, trainable ones, each unit's) of the
    model fn() returns; its units are the elements of its nn.ModuleLists (its blocks), as one would wrap
    them. A unit with frozen weights stays gathered longer and has fewer optimizer states (UnitSize)."""
    import importlib
    import importlib.util

    from torch import nn

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"--model takes FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if where.endswith(".py"):
        loader = importlib.util.spec_from_file_location("hocc_advise_model", where)
        if loader is None or loader.loader is None:
            raise ValueError(f"--model: cannot load {where!r}")
        mod = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    model = getattr(mod, name)()
    units = [UnitSize(sum(p.numel() for p in blk.parameters()),
                      sum(p.numel() for p in blk.parameters() if p.requires_grad))
             for m in model.modules() if isinstance(m, nn.ModuleList) for blk in m]
    return (sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad),
            units)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="paro_cmd", required=True)
    a = sub.add_parser("advise", help="rank the PaRO strategies that fit in memory", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--params", type=float, help="parameters of the model, e.g. 7e9")
    a.add_argument("--units", type=int, default=0, help="the model is wrapped as this many equal units (its "
                                                         "blocks) under a root; default: one unit")
    a.add_argument("--model", help="FILE.py:FUNCTION or MODULE:FUNCTION returning the model: its parameters "
                                   "and units (the elements of its nn.ModuleLists) are counted")
    a.add_argument("--compute-ms", type=float, help="measured compute time of one micro-step (forward and "
                                                    "backward): rank by time per step with overlap")
    a.add_argument("--overlap", type=float, default=1.0,
                   help="with --compute-ms: the share of the shorter of a micro-step's compute and communication "
                        "hidden behind the other (default 1, the paper's; 0 where ranks share their CPU cores with "
                        "their communication, as on the emulated cluster: bench/results/paro/priced.md)")
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
    trainable: int | None = None
    units: list[int | UnitSize]
    if a.model:
        numel, trainable, sized = model_units(a.model)
        units = list(sized)
    elif a.params:
        numel = int(a.params)
        units = [numel // a.units] * a.units if a.units else []
    else:
        raise ValueError("give the model's size: --params N (with --units U) or --model FILE.py:FUNCTION")
    a.params = numel
    compute = a.compute_ms / 1e3 if a.compute_ms is not None else None
    opts = evaluate(numel, topo, a.accum, budget, parse_bytes(a.bytes), a.elem_size, a.backend, names,
                    parse_memory(a.reserve), units, compute, trainable, a.overlap)
    print(f"# PaRO-DP on {topo.shape()} ({topo.world_size} ranks), {a.params:.4g} parameters "
          f"{f'({trainable:.4g} trainable) ' if trainable is not None and trainable < numel else ''}in "
          f"{len(units) or 1} unit(s){' and a root' if units else ''}, accum {a.accum}, "
          f"memory {a.memory or 'unlimited'}, backend {a.backend}; * = a strategy the paper names")
    print(table(opts))
    print()
    print(explain(opts, budget))
    if a.json:
        rows = [{"strategy": o.strategy, "fits": o.fits, "seconds": o.seconds, **o.memory.as_dict(),
                 "memory_total": o.memory.total, "peak": o.peak.as_dict(), "peak_total": o.peak.total,
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
