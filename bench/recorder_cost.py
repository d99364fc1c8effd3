"""What the flight recorder adds to a call's path, without the network's noise.

One rank (a gloo world of 1), two groups over it: the world, whose engine has
the recorder on, and a copy made while it was off. 4-byte all_reduce calls
through hocc alternate between the two in blocks (ABBA order), so both see the
same machine; the per-call difference is what recording costs on the caller's
path: the call's record, its arrival and end, and the executor's notes per
step (a world of one runs one step). Across ranks the same work is done per
rank, plus per step and exchange a few clock reads (bench/call_overhead.py
--record-ab times that, with the network's noise).

    .venv/bin/python bench/recorder_cost.py [--calls 2000] [--blocks 40] [--algo ho_ring]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import hocc
from hocc.bench.launch import free_port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per block")
    p.add_argument("--blocks", type=int, default=40, help="blocks per side")
    p.add_argument("--algo", default="native")
    a = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1)
    on_cap = hocc.get_config().record
    hocc.configure(record=0)
    off = dist.new_group([0])
    hocc.all_reduce(t, group=off, algo=a.algo)  # its engine, made with the recorder off
    hocc.configure(record=on_cap)
    hocc.all_reduce(t, algo=a.algo)  # the world's, with it on

    def block(group: object) -> float:
        start = time.perf_counter()
        for _ in range(a.calls):
            hocc.all_reduce(t, group=group, algo=a.algo)  # type: ignore[arg-type]
        return (time.perf_counter() - start) / a.calls

    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(a.blocks):
        order = (("on", None), ("off", off)) if i % 2 == 0 else (("off", off), ("on", None))
        for name, group in order:
            times[name].append(block(group))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# 4-byte all_reduce (algo {a.algo}), a gloo world of 1, {a.blocks} blocks of {a.calls} calls per side, "
          f"ABBA; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"  recorder on  : {med['on'] * 1e6:8.2f} us/call (blocks {min(times['on']) * 1e6:.2f}-"
          f"{max(times['on']) * 1e6:.2f})")
    print(f"  recorder off : {med['off'] * 1e6:8.2f} us/call (blocks {min(times['off']) * 1e6:.2f}-"
          f"{max(times['off']) * 1e6:.2f})")
    low = {k: min(v) for k, v in times.items()}
    print(f"  difference   : {(med['on'] - med['off']) * 1e6:8.2f} us/call between the medians, "
          f"{(low['on'] - low['off']) * 1e6:.2f} between the fastest blocks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
