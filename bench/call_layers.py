"""Where a small sync call's time goes, layer by layer: a 4-byte all_reduce as
gloo's own call, as hocc's C++ comm alone (its tiny exchange over the world's
gloo backend, called straight from Python), as the engine's executor run
alone, as that run after a Python spin of --spin-us (what the engine's Python
costs once two ranks wait on each other), and as hocc.all_reduce(algo='native').
Beside the gloo path, the same layers over UCX (csrc/transport/ucx.h): one bare
ring step (exchange) on each comm, and UcxComm's all_reduce. The engine's
own rows run over whichever HOCC_NET_TRANSPORT picks (run once with =gloo and
once with =ucx to compare them end to end). Interleaved in rounds; medians, rank 0's.

    OMP_NUM_THREADS=1 .venv/bin/python bench/call_layers.py --nprocs 2 --calls 2000
    OMP_NUM_THREADS=1 HOCC_TOPOLOGY=2x4 .venv/bin/python bench/call_layers.py --nprocs 8 --calls 300
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hocc
from hocc.bench.launch import free_port
from hocc.engine.group_engines import find_engine
from hocc.engine.ucx import attach_ucx
from hocc.executor import load, ucx_unavailable


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _rank(rank: int, world: int, port: int, calls: int, rounds: int, spins: list[float]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(1)
    world_group = dist.group.WORLD
    assert world_group is not None
    comm = load().c10d_comm(world_group._get_backend(torch.device("cpu")), rank, world)
    store = dist.distributed_c10d._get_default_store()
    ucx = attach_ucx(store, "call_layers/ucx", rank, world, timedelta(seconds=60), "ucx") if not \
        ucx_unavailable() else None
    got = torch.zeros(1)
    hocc.all_reduce(t, algo="native")
    engine = find_engine(dist.group.WORLD, torch.device("cpu"))
    assert engine is not None and engine._last is not None
    plan = engine._last.cpp

    def executor_run(spin_us: float = 0.0) -> None:
        if spin_us:
            _spin(spin_us)
        engine.executor.run(plan, t.data_ptr(), t.data_ptr(), 0, "float32", "sum", 0, None, -1)

    ways: dict[str, Callable[[], object]] = {
        "gloo all_reduce": lambda: dist.all_reduce(t),
        "gloo comm: one exchange": lambda: comm.exchange(t.data_ptr(), 1, got.data_ptr(), 1, "float32"),
        "hocc C++ comm alone": lambda: comm.all_reduce(t.data_ptr(), 1, "float32", "sum"),
        **({"ucx comm: one exchange": lambda: ucx.exchange(t.data_ptr(), 1, got.data_ptr(), 1, "float32"),
            "ucx comm all_reduce alone": lambda: ucx.all_reduce(t.data_ptr(), 1, "float32", "sum")}
           if ucx is not None else {}),
        "engine's executor run alone": executor_run,
        **{f"executor run + {us:g} us Python": functools.partial(executor_run, us) for us in spins},
        "hocc.all_reduce native": lambda: hocc.all_reduce(t, algo="native"),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(rounds + 1):  # round 0 warms up
        for name, fn in ways.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if r:
                times[name].append((time.perf_counter() - start) / calls)
    if rank == 0:
        base = statistics.median(times["gloo all_reduce"])
        print(f"# 4-byte all_reduce, {world} local ranks, {calls} calls x {rounds} rounds, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
              f"HOCC_TOPOLOGY={os.environ.get('HOCC_TOPOLOGY', 'unset')}, "
              f"engine's net transport: {sorted(set(engine.last_plan.meta.get('transports', {}).values()))}")
        print(f"# {'way':<34} {'us/call':>9} {'x gloo':>7}")
        for name, v in times.items():
            m = statistics.median(v)
            print(f"  {name:<34} {m * 1e6:>9.1f} {m / base:>7.2f}")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spin-us", type=float, nargs="*", default=[25.0, 50.0, 150.0])
    a = p.parse_args()
    mp.spawn(_rank, args=(a.nprocs, free_port(), a.calls, a.rounds, a.spin_us), nprocs=a.nprocs, join=True)


if __name__ == "__main__":
    main()
