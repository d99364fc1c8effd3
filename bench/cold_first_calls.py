"""A cold process's first calls, one per algorithm, each on a fresh group, with a
watchdog: a rank still running after --stall seconds writes every thread's Python
stack to --dump-dir (faulthandler), so a hang in set-up (communicators, UCX
endpoints, shared memory) names its place. Rank 0 prints one line: each first
call's milliseconds, the slowest rank's. Launch it many times to catch a rare stall:

    for i in $(seq 30); do OMP_NUM_THREADS=1 timeout 200 .venv/bin/python bench/cluster.py 4x2 \\
        --script bench/cold_first_calls.py -- --dump-dir /tmp/cold/$i; done

(docs/executor.md, "UCX between hosts": the idle progress that held a new comm's mutex.)"""

from __future__ import annotations

import argparse
import faulthandler
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import hocc
from hocc.bench.runner import slowest
from hocc.plan.registry import names

ALGOS = (*names(), "auto")  # every registered algorithm, as bench/auto_sweep.py runs them


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=64 << 10, help="all_gather output bytes (default 64 KiB)")
    p.add_argument("--stall", type=float, default=20.0, help="seconds after which every rank dumps its stacks")
    p.add_argument("--dump-dir", default="/tmp/hocc-cold")
    a = p.parse_args()
    os.environ.pop("HOCC_TOPOLOGY", None)  # the hosts detected, as a user gets them
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    Path(a.dump_dir).mkdir(parents=True, exist_ok=True)
    dump = open(Path(a.dump_dir) / f"rank{rank}-pid{os.getpid()}.txt", "w")  # noqa: SIM115 - faulthandler's
    faulthandler.dump_traceback_later(a.stall, file=dump)
    small, big = torch.ones(a.bytes // 4 // world), torch.ones(a.bytes // 4)
    groups = {algo: dist.new_group(backend="gloo") for algo in ALGOS}
    took = {}
    for algo in ALGOS:
        hocc.all_reduce(torch.zeros(1), group=groups[algo], algo="ho_ring")  # the group's set-up, and a barrier
        t0 = time.perf_counter()
        hocc.all_gather_into_tensor(big, small, group=groups[algo], algo=algo)
        took[algo] = time.perf_counter() - t0
    faulthandler.cancel_dump_traceback_later()
    ms = {algo: round(slowest(s) * 1e3, 1) for algo, s in took.items()}
    if rank == 0:
        print("first calls (ms):", ms, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
