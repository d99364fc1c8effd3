"""Large calls timed as a training job meets them: torch processes, one per
rank (one thread each), each call begun together after a barrier, gloo's own
call interleaved with hocc's algorithms call by call, fresh-looking tensors
(the same ones reused, as a training loop reuses its buckets), medians of
--iters after --warmup, the slowest rank's time. Run one process per rank
under a launcher (bench/cluster.py --script, torchrun); rank 0 prints one JSON
line per (op, way):

    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/per_host_run.py -- --size 64M --ops all_reduce

hocc-bench differs on purpose: back-to-back iterations of one algorithm, no
barrier between them, rank 0's time (nccl-tests' way). bench/regression.py
runs this script for two commits side by side (docs/testbed.md)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import hocc
from hocc.bench.collectives import COLLECTIVES
from hocc.bench.sizes import parse_size


def _gloo(op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
    """gloo's own call, the baseline (hocc's calls go through hocc-bench's BenchCollective.launch)."""
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="16M", help="bytes per call, as hocc-bench's -b (K, M, G)")
    p.add_argument("--ops", default="all_reduce", help="comma list of all_reduce, all_gather, reduce_scatter")
    p.add_argument("--algos", default="ho_ring", help="hocc's ways, comma list (gloo's own call always runs)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tag", default="", help="copied into each JSON line (e.g. the commit)")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nbytes = parse_size(a.size)
    ways = ["gloo", *a.algos.split(",")]
    for op in a.ops.split(","):
        coll = COLLECTIVES[op]  # nccl-tests' sizes and data, as hocc-bench's
        inp, out = coll.buffers(nbytes, torch.float32, world, rank, torch.device("cpu"))
        fresh = inp.clone()
        times: dict[str, list[float]] = {w: [] for w in ways}
        for it in range(a.warmup + a.iters):
            for way in ways:
                dist.barrier()
                t0 = time.perf_counter()
                if way == "gloo":
                    _gloo(op, inp, out)
                else:
                    coll.launch(inp, out, "sum", way)
                took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's time
                if it >= a.warmup:
                    times[way].append(float(took))
                if op == "all_reduce":
                    inp.copy_(fresh)  # in place: keep the values bounded
        if rank == 0:
            for way in ways:
                print(json.dumps({"tag": a.tag, "op": op, "size": nbytes, "way": way, "world": world,
                                  "median_s": statistics.median(times[way]), "times_s": times[way]}), flush=True)
    hocc.reset_engines()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
