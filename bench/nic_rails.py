"""The transfer between hosts alone, without HO-Ring's host stages: on the
emulated 2x4 (ranks i and i+4 on different hosts), 1 or 4 two-member groups
{i, i+4} (HO-Ring's rails) each run a ring all_reduce of SIZE at once, as
HO-Ring's NIC stage does; rank 0 prints the slowest rank's milliseconds per
call and the fraction of the NIC bound (each host sends SIZE per rail).

    sudo OMP_NUM_THREADS=1 .venv/bin/python bench/cluster.py 2x4 --rate 1gbit --script bench/nic_rails.py
    sudo OMP_NUM_THREADS=1 .venv/bin/python bench/cluster.py 2x4 --rate 1gbit --script bench/nic_rails.py -- --mib 16
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import hocc
from hocc.topology.links import parse_rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=64, help="MiB each rail all-reduces per call (default 64)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="the cluster's NIC rate, for the bound (default 1gbit)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    half = world // 2
    groups = [dist.new_group([i, i + half]) for i in range(half)]
    x = torch.ones(a.mib << 18)  # float32
    nic_bytes_per_s = parse_rate(a.rate)  # bytes/s
    for rails in (half, 1):
        active = rank % half < rails
        if active:
            hocc.all_reduce(x, group=groups[rank % half], algo="ring")  # set-up
        for _ in range(a.rounds):
            dist.barrier()
            t0 = time.perf_counter()
            if active:
                hocc.all_reduce(x, group=groups[rank % half], algo="ring")
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if rank == 0:
                sent = rails * x.numel() * 4  # a 2-member ring all_reduce sends its whole buffer once per rail
                print(f"{rails} rail(s) x {a.mib} MiB: {float(took) * 1e3:.0f} ms, "
                      f"{sent / nic_bytes_per_s / float(took):.0%} of the NIC bound", flush=True)
    hocc.reset_engines()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
