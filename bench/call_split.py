"""Where a small call's time goes: a 4-byte hocc.all_reduce, then the same
plan's C++ run alone (the engine queue's run_here, as the call makes it, with
none of the Python around it), in a loop of sync calls on local CPU ranks.
Rank 0 prints microseconds per call for each, per round.

    OMP_NUM_THREADS=1 .venv/bin/python bench/call_split.py --nprocs 2
    OMP_NUM_THREADS=1 HOCC_TOPOLOGY=2x4 .venv/bin/python bench/call_split.py --nprocs 8
    OMP_NUM_THREADS=1 .venv/bin/python bench/cluster.py 2x4 --script bench/call_split.py   # emulated hosts
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import hocc
from hocc.bench.launch import free_port, start_local_ranks


def _rank(rank: int, world: int, port: int, calls: int, rounds: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # set already under a launcher (bench/cluster.py --script)
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from hocc.engine.group_engines import get_engine

    t = torch.ones(1)
    for _ in range(300):  # auto's trials, then its pick
        hocc.all_reduce(t)
    eng = get_engine(dist.group.WORLD, torch.device("cpu"))  # type: ignore[arg-type]
    entry = eng._last
    assert entry is not None

    def loop(fn: object) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()  # type: ignore[operator]
        return (time.perf_counter() - start) / calls * 1e6

    seq = iter(range(10**9, 2 * 10**9))  # the checked runs' call numbers, alike on every rank

    def checked() -> None:  # as the call makes it: with its CallId, which the communicators compare
        n = next(seq)
        eng._queue.run_here(eng.executor, entry.cpp, t, t, "float32", "sum", (n, entry.hash, 1, "all_reduce",
                                                                               entry.algo), n)

    full, cpp, check = [], [], []
    for _ in range(rounds):
        full.append(loop(lambda: hocc.all_reduce(t)))
        cpp.append(loop(lambda: eng._queue.run_here(eng.executor, entry.cpp, t, t, "float32", "sum", None, 0)))
        check.append(loop(checked))
    if rank == 0:
        print(f"# {world} ranks, {entry.plan.summary()}")
        print("hocc.all_reduce        " + " ".join(f"{x:.1f}" for x in full) + " us/call")
        print("C++ run alone          " + " ".join(f"{x:.1f}" for x in cpp) + " us/call")
        print("C++ run, call checked  " + " ".join(f"{x:.1f}" for x in check) + " us/call")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one rank of a launcher's (torchrun, bench/cluster.py)
        _rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0, a.calls, a.rounds)
        return
    start_local_ranks(_rank, (a.nprocs, free_port(), a.calls, a.rounds), a.nprocs)


if __name__ == "__main__":
    main()
