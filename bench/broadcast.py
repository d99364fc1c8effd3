"""broadcast on a "hocc" group (planned from hocc.backend.process_group's
PLANNED_BROADCAST_BYTES: a sum of the root's bytes and zeros, which follows the
hierarchy) against gloo's own one-to-all, per size. Calls of the two groups
interleave; each starts together (a barrier), its time is the slowest rank's;
medians after the first two rounds. One process per rank under a launcher;
rank 0 prints one JSON line per size:

    OMP_NUM_THREADS=1 .venv/bin/python bench/cluster.py 2x4 --script bench/broadcast.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/cluster.py 4x2 --script bench/broadcast.py

The launcher's HOCC_TOPOLOGY is dropped: hocc detects the hosts, as a user who
sets nothing gets."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from hocc.bench.runner import slowest
from hocc.bench.sizes import parse_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4,256,4K,32K,64K,1M,4M,16M", help="bytes per call, comma-separated")
    p.add_argument("--rounds", type=int, default=12, help="calls per group and size (6 from 1 MiB)")
    a = p.parse_args()
    os.environ.pop("HOCC_TOPOLOGY", None)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import hocc  # noqa: F401 - registers the backend

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = {"gloo": dist.new_group(backend="gloo"), "hocc": dist.new_group(backend="hocc")}
    for size in (parse_size(s) for s in a.sizes.split(",")):
        x = torch.ones(max(size // 4, 1))
        times: dict[str, list[float]] = {k: [] for k in groups}
        for i in range(a.rounds if size < (1 << 20) else max(a.rounds // 2, 3)):
            for name, g in sorted(groups.items(), reverse=i % 2 == 1):
                dist.barrier()
                start = time.perf_counter()
                dist.broadcast(x, 0, group=g)
                times[name].append(slowest(time.perf_counter() - start))
        if rank == 0:
            med = {k: statistics.median(v[2:]) for k, v in times.items()}
            print(json.dumps({"bytes": x.nbytes, "world": dist.get_world_size(), "gloo_ms": round(med["gloo"] * 1e3, 3),
                              "hocc_ms": round(med["hocc"] * 1e3, 3), "x_gloo": round(med["gloo"] / med["hocc"], 2)}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
