#!/usr/bin/env python3
"""auto as a user meets it, call by call: per op and size, a fresh group per
algorithm, --calls calls of each registered algorithm (hocc.plan.registry)
and auto interleaved (the order rotates each round), every call started together (a
barrier) and timed on every rank; a call's time is the slowest rank's. auto
runs as it comes (its trials included) from its group's first call. The
barrier is a 1-element ho_ring all_reduce on the call's own group: the first
hocc call after a gloo barrier takes about 3x its time in a loop (emulated
2x4, 32 B), which every small call here would measure.

For each (op, size) rank 0 prints a JSON line and, at the end, a table:
- steady: the median call of each algorithm after the first --first calls,
  and auto's against the fastest fixed one (the issue's bound: 1.05);
- first: the sum of auto's first --first calls against native's (bound 1).

    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/auto_sweep.py -- --no-topology
    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/auto_sweep.py -- --topology-as 2x4@nic=10gbit

--no-topology drops the launcher's HOCC_TOPOLOGY (hocc detects the hosts);
--topology-as gives hocc a description of its own (links described wrongly,
say)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from hocc.bench.runner import slowest
from hocc.bench.sizes import format_size, parse_size
from hocc.plan.registry import names

FIXED = names()  # every registered algorithm: auto is held to the fastest of them
ALGOS = (*FIXED, "auto")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--sizes", default="4,256,4K,64K,1M,4M", help="bytes of the larger buffer (nccl-tests' size)")
    p.add_argument("--calls", type=int, default=80, help="calls of each algorithm per size")
    p.add_argument("--first", type=int, default=50, help="auto's first calls: summed against native's")
    p.add_argument("--no-topology", action="store_true", help="let hocc detect the hosts (drop HOCC_TOPOLOGY)")
    p.add_argument("--topology-as", help="HOCC_TOPOLOGY for hocc instead of the launcher's")
    p.add_argument("--json", help="rank 0 appends a JSON line per (op, size) here")
    a = p.parse_args()
    if a.no_topology:
        os.environ.pop("HOCC_TOPOLOGY", None)
    if a.topology_as:
        os.environ["HOCC_TOPOLOGY"] = a.topology_as
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import hocc

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in a.ops.split(","):
        for size in [parse_size(s) for s in a.sizes.split(",")]:
            per = max(1, size // 4 // (1 if op == "all_reduce" else world))
            big, small, token = torch.ones(per * world), torch.ones(per), torch.zeros(1)
            groups = {algo: dist.new_group(backend="gloo") for algo in ALGOS}  # fresh engines: auto starts cold
            times = torch.zeros(a.calls, len(ALGOS), dtype=torch.float64)
            for i in range(a.calls):
                for k in range(len(ALGOS)):
                    j = (i + k) % len(ALGOS)
                    algo, g = ALGOS[j], groups[ALGOS[j]]
                    hocc.all_reduce(token, group=g, algo="ho_ring")  # the barrier: hocc's own (module doc)
                    t0 = time.perf_counter()
                    if op == "all_reduce":
                        hocc.all_reduce(small, group=g, algo=algo)
                    elif op == "all_gather":
                        hocc.all_gather_into_tensor(big, small, group=g, algo=algo)
                    else:
                        hocc.reduce_scatter_tensor(small, big, group=g, algo=algo)
                    times[i, j] = time.perf_counter() - t0
            slowest(times)  # in place
            for g in groups.values():
                dist.destroy_process_group(g)
            col = {algo: times[:, j].tolist() for j, algo in enumerate(ALGOS)}
            steady = {algo: statistics.median(col[algo][a.first:]) for algo in ALGOS}
            fastest = min(FIXED, key=lambda x: steady[x])
            row = {"op": op, "bytes": size, "world": world, "topology": os.environ.get("HOCC_TOPOLOGY", "detected"),
                   "calls": a.calls, "first": a.first, "steady_s": steady, "fastest": fastest,
                   "auto_vs_fastest": steady["auto"] / steady[fastest],
                   "first_auto_s": sum(col["auto"][:a.first]), "first_native_s": sum(col["native"][:a.first]),
                   "times_s": col}
            row["first_auto_vs_native"] = row["first_auto_s"] / row["first_native_s"]
            rows.append(row)
            if rank == 0:
                print(json.dumps({k: v for k, v in row.items() if k != "times_s"}), flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    if rank == 0:
        print("\n| op | size | " + " | ".join(FIXED) + f" | auto (after {a.first}) | auto / fastest | "
              f"auto's first {a.first} / native's |")
        print("| --- " * (len(ALGOS) + 4) + "|")
        for r in rows:
            s = r["steady_s"]
            print(f"| {r['op']} | {format_size(r['bytes'])} | " + " | ".join(f"{s[x] * 1e3:.2f} ms" for x in ALGOS)
                  + f" | {r['auto_vs_fastest']:.2f} ({r['fastest']}) | {r['first_auto_vs_native']:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
