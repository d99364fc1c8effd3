"""auto after tuning, against the fastest of native, ring and ho_ring, on
whatever ranks run it (an emulated cluster's, through bench/cluster.py's
--script). Per op and size: auto's trials run first (calls and seconds
counted), then rounds of each algorithm, interleaved (short calls timed in batches);
each rank's median per algorithm, the slowest rank's reported.

    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/tuned_auto.py -- --json out.json
    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/tuned_auto.py -- --topology 2x4@nic=10gbit

--topology describes the cluster to hocc (HOCC_TOPOLOGY) instead of the
cluster's own spec: a wrong description, to see tuning make up for it.
Sizes are the buffer S as hocc-bench counts it (all_reduce: the tensor;
all_gather: the output; reduce_scatter: the input)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ALGOS = ("native", "ring", "ho_ring", "auto")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4,4K,256K,4M,64M")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--rounds", type=int, default=5, help="rounds (at most 3 from 16 MiB up)")
    p.add_argument("--topology", help="HOCC_TOPOLOGY to give hocc (default: the cluster's own)")
    p.add_argument("--json", help="write the rows here (rank 0)")
    a = p.parse_args()
    if a.topology:
        os.environ["HOCC_TOPOLOGY"] = a.topology
    import torch
    import torch.distributed as dist

    import hocc
    from hocc.bench.collectives import COLLECTIVES as BENCH
    from hocc.bench.collectives import BenchCollective
    from hocc.bench.runner import slowest
    from hocc.bench.sizes import parse_size
    from hocc.engine.group_engines import get_engine
    from hocc.plan.crossover import bucket_of

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hocc.configure(tune=True, algo="auto")
    tuner = get_engine(dist.group.WORLD, torch.device("cpu")).tuner()  # type: ignore[arg-type]
    rows = []
    for op in a.ops.split(","):
        for size in (parse_size(s) for s in a.sizes.split(",")):
            coll = BENCH[op]
            inp, out = coll.buffers(max(size, 4 * (1 if op == "all_reduce" else world)), torch.float32, world,
                                    rank, torch.device("cpu"))
            per = out.numel() if op == "reduce_scatter" else inp.numel()  # the plan's count per rank

            def call(algo: str, coll: BenchCollective = coll, inp: torch.Tensor = inp, out: torch.Tensor = out) -> None:
                coll.launch(inp, out, "sum", algo)

            key = (op, "float32", bucket_of(per * 4))
            calls, t0 = 0, time.perf_counter()
            while key not in tuner.decided():
                call("auto")
                calls += 1
            tune_s = time.perf_counter() - t0
            plans = {}
            for algo in ALGOS:  # set-up, untimed; which plan each runs (auto's: its pick)
                call(algo)
                plan = hocc.last_plan()
                assert plan is not None
                plans[algo] = f"{plan.algo}@{plan.chunks}" if plan.algo == "ho_ring" else plan.algo
            batch = 20 if size <= 64 << 10 else 5 if size <= 4 << 20 else 1  # short calls timed in batches
            times: dict[str, list[float]] = {x: [] for x in ALGOS}
            for _ in range(a.rounds if size < 16 << 20 else min(a.rounds, 3)):
                for algo in ALGOS:
                    dist.barrier()
                    t = time.perf_counter()
                    for _ in range(batch):
                        call(algo)
                    times[algo].append((time.perf_counter() - t) / batch)
            med = slowest([statistics.median(times[x]) for x in ALGOS])
            pick = tuner.decided()[key]
            row = {"op": op, "size": size, **dict(zip(ALGOS, med, strict=True)),
                   "pick": f"{pick.algo}@{pick.chunks}" if pick.chunks else pick.algo, "why": pick.why,
                   "tune_calls": calls, "tune_s": tune_s}
            fastest = min(ALGOS[:-1], key=lambda x: row[x])
            row["auto_vs_fastest"] = row["auto"] / row[fastest]
            row["plans"] = plans
            row["fastest"] = fastest
            row["same_plan_as_fastest"] = plans["auto"] == plans[fastest]
            rows.append(row)
            if rank == 0:
                print(f"{op:<15} {size:>10} " + " ".join(f"{x} {row[x] * 1e3:9.2f} ms" for x in ALGOS)
                      + f"  auto/fastest {row['auto_vs_fastest']:.3f}  pick {row['pick']} "
                      f"(fastest: {plans[fastest]})  "
                      f"tuning {calls} calls {tune_s:.1f} s", flush=True)
    if rank == 0 and a.json:
        meta = {"world": world, "topology": os.environ.get("HOCC_TOPOLOGY"), "rounds": a.rounds,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads()}
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
