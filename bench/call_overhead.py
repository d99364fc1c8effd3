"""Per-call cost of a tiny collective: a 4-byte all_reduce through hocc
(`auto`, `native` through hocc, and torch's dist.all_reduce on a "hocc"
backend group) against the backend's own call, sync and async, on local CPU
ranks (gloo). Interleaved in rounds; medians of each rank's per-call times, the
slowest rank reported.

    .venv/bin/python bench/call_overhead.py --nprocs 2 --calls 2000
    OMP_NUM_THREADS=1 .venv/bin/python bench/call_overhead.py --nprocs 8
    .venv/bin/python bench/call_overhead.py --nprocs 8 --record-ab               # the flight recorder on / off
    .venv/bin/python bench/call_overhead.py --nprocs 8 --record-ab --bytes 67108864 --calls 2 --rounds 4
    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/call_overhead.py -- --calls 300   # real hosts' links

Under a launcher (RANK and WORLD_SIZE set: torchrun, bench/cluster.py --script) each process is one rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hocc
from hocc.bench.launch import free_port
from hocc.bench.runner import slowest

WAYS = ("gloo", "hocc-native", "hocc-auto", "hocc-backend")  # hocc-backend: torch's dist.all_reduce on a "hocc" group
# --record-ab: the same hocc calls on a copy of the world whose engine has the flight recorder off
NO_RECORD = ("hocc-native/no-record", "hocc-auto/no-record")
_no_record_group: Any = None
_record_group: Any = None  # None: the world
_backend_group: Any = None  # a "hocc" backend group over the world


def _call(way: str, t: torch.Tensor, async_op: bool) -> object:
    if way == "gloo":
        return dist.all_reduce(t, async_op=async_op)
    if way == "hocc-backend":
        return dist.all_reduce(t, async_op=async_op, group=_backend_group)
    group = _no_record_group if "/no-record" in way else _record_group
    algo = "native" if way.startswith("hocc-native") else "auto"
    return hocc.all_reduce(t, async_op=async_op, algo=algo, group=group)


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


def _rank(rank: int, world: int, port: int, calls: int, rounds: int, out: str, nbytes: int, record_ab: bool,
          swap: bool) -> None:
    global _no_record_group, _record_group, _backend_group
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # set already under a launcher (bench/cluster.py --script)
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(max(nbytes // 4, 1))
    _backend_group = dist.new_group(backend="hocc")
    ways = WAYS + (NO_RECORD if record_ab else ())
    if record_ab:  # the copy's engine is made with the recorder off, the world's with it on (--swap: the reverse)
        copy = dist.new_group(list(range(world)))
        on = hocc.get_config().record
        first, second = (on, 0) if swap else (0, on)
        hocc.configure(record=first)
        hocc.all_reduce(t, group=copy)
        hocc.configure(record=second)
        hocc.all_reduce(t)
        hocc.configure(record=on)
        _record_group, _no_record_group = (copy, None) if swap else (None, copy)
    for way in ways:  # warm-up: engines, plans, communicators
        for a in (False, True):
            _measure(way, a, min(calls, 20), t)
    times: dict[str, list[float]] = {f"{w}/{'async' if a else 'sync'}": [] for w in ways for a in (False, True)}
    for _ in range(rounds):
        for way in ways:
            for a in (False, True):
                times[f"{way}/{'async' if a else 'sync'}"].append(_measure(way, a, calls, t))
    med = slowest([statistics.median(v) for v in times.values()])
    if rank == 0:
        res = dict(zip(times, med, strict=True))
        where = "" if not record_ab else ("; recorder on in a copy of the world, off in the world" if swap else
                                          "; recorder on in the world, off in a copy of it")
        print(f"# {t.numel() * 4}-byte all_reduce, {world} local CPU ranks, {calls} calls x {rounds} rounds{where}, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
              f"HOCC_TOPOLOGY={os.environ.get('HOCC_TOPOLOGY', 'unset')}")
        print(f"# {'way':<32} {'us/call':>10} {'x gloo':>8}" + (f" {'x recorder off':>15}" if record_ab else ""))
        for key, secs in res.items():
            mode = key.rsplit("/", 1)[1]
            base = res["gloo/" + mode]
            line = f"  {key:<32} {secs * 1e6:>10.1f} {secs / base:>8.2f}"
            off = res.get(key.replace(f"/{mode}", f"/no-record/{mode}"))
            if record_ab and off and "no-record" not in key and key.startswith("hocc"):
                line += f" {secs / off:>15.3f}"
            print(line)
        if out:
            with open(out, "w") as f:
                json.dump({"world": world, "calls": calls, "rounds": rounds, "bytes": t.numel() * 4,
                           "topology": os.environ.get("HOCC_TOPOLOGY"),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "swap": swap,
                           "seconds_per_call": res}, f,
                          indent=1)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="")
    p.add_argument("--bytes", type=int, default=4, help="bytes per call (default 4; float32 elements)")
    p.add_argument("--record-ab", action="store_true",
                   help="also time hocc's calls with the flight recorder off, interleaved in the same rounds "
                        "(on: the world; off: a copy of it)")
    p.add_argument("--swap", action="store_true", help="with --record-ab: the recorder on in the copy, off in the "
                                                        "world (to tell the recorder from the group)")
    a = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one rank of a launcher's (torchrun, bench/cluster.py)
        _rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0, a.calls, a.rounds, a.json, a.bytes,
              a.record_ab, a.swap)
        return
    mp.spawn(_rank, args=(a.nprocs, free_port(), a.calls, a.rounds, a.json, a.bytes, a.record_ab, a.swap),
             nprocs=a.nprocs, join=True)


if __name__ == "__main__":
    main()
