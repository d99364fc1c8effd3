"""Per-call cost of a tiny collective: a 4-byte all_reduce through hocc
(`auto`, and `native` through hocc) against the backend's own call, sync and
async, on local CPU ranks (gloo). Interleaved in rounds; medians of each
rank's per-call times, the slowest rank reported.

    .venv/bin/python bench/call_overhead.py --nprocs 2 --calls 2000
    OMP_NUM_THREADS=1 .venv/bin/python bench/call_overhead.py --nprocs 8
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hocc

WAYS = ("gloo", "hocc-native", "hocc-auto")


def _call(way: str, t: torch.Tensor, async_op: bool) -> object:
    if way == "gloo":
        return dist.all_reduce(t, async_op=async_op)
    return hocc.all_reduce(t, async_op=async_op, algo="native" if way == "hocc-native" else "auto")


def _measure(way: str, async_op: bool, calls: int, t: torch.Tensor) -> float:
    """Seconds per call: sync calls one after another; async calls all issued, then waited for."""
    dist.barrier()
    start = time.perf_counter()
    if async_op:
        works = [_call(way, t, True) for _ in range(calls)]
        for w in works:
            w.wait()  # type: ignore[union-attr]
    else:
        for _ in range(calls):
            _call(way, t, False)
    return (time.perf_counter() - start) / calls


def _rank(rank: int, world: int, port: int, calls: int, rounds: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(1)
    for way in WAYS:  # warm-up: engines, plans, communicators
        for a in (False, True):
            _measure(way, a, 20, t)
    times: dict[str, list[float]] = {f"{w}/{'async' if a else 'sync'}": [] for w in WAYS for a in (False, True)}
    for _ in range(rounds):
        for way in WAYS:
            for a in (False, True):
                times[f"{way}/{'async' if a else 'sync'}"].append(_measure(way, a, calls, t))
    med = torch.tensor([statistics.median(v) for v in times.values()], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        res = dict(zip(times, (float(x) for x in med), strict=True))
        print(f"# 4-byte all_reduce, {world} local CPU ranks, {calls} calls x {rounds} rounds, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
        print(f"# {'way':<22} {'us/call':>10} {'x gloo':>8}")
        for key, secs in res.items():
            base = res["gloo/" + key.split("/")[1]]
            print(f"  {key:<22} {secs * 1e6:>10.1f} {secs / base:>8.2f}")
        if out:
            with open(out, "w") as f:
                json.dump({"world": world, "calls": calls, "rounds": rounds,
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "seconds_per_call": res}, f,
                          indent=1)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(a.nprocs, port, a.calls, a.rounds, a.json), nprocs=a.nprocs, join=True)


if __name__ == "__main__":
    main()
