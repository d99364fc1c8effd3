"""What hocc's heap trimming (HOCC_MALLOC_TRIM_S, hocc/engine/heap.py) costs
and gives: rounds of the same calls with trimming off and on, alternated in
one job, so both modes meet the same machine. Each call is a fresh CPU
tensor of a log-uniform size (a new size each call: the case that fragments
glibc's heap), all-reduced by hocc (auto) on local ranks. Per mode: the
median of the rounds' seconds per call (slowest rank) and RSS at the rounds'
ends (mean over rounds, largest rank).

    .venv/bin/python bench/heap_trim_cost.py --nprocs 4 --topology 2x2
    OMP_NUM_THREADS=1 .venv/bin/python bench/heap_trim_cost.py --nprocs 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hocc.bench.launch import free_port, start_local_ranks
from hocc.bench.runner import slowest

MODES = ("off", "on")


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HOCC_TOPOLOGY=args.topology)
    import hocc

    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    rng = random.Random(args.seed)  # the same sizes on every rank
    lo, hi = 12, args.max_bytes.bit_length() - 1  # 4 KiB .. max_bytes

    def one_call() -> None:
        n = max(1, int(2 ** rng.uniform(lo, hi)) // 4)
        hocc.all_reduce(torch.full((n,), 1.0))

    for _ in range(args.calls // 2):  # warm-up: plans, communicators, buffers
        one_call()
    interval = {"off": 0.0, "on": args.interval}
    per: dict[str, list[float]] = {m: [] for m in MODES}
    rss: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            hocc.configure(malloc_trim_s=interval[mode])
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                one_call()
            per[mode].append((time.perf_counter() - start) / args.calls)
            rss[mode].append(_rss_mib())
    most = slowest([statistics.median(per[m]) for m in MODES] + [statistics.mean(rss[m]) for m in MODES])
    if rank == 0:
        secs = dict(zip(MODES, most[:2], strict=True))
        mib = dict(zip(MODES, most[2:], strict=True))
        threads = args.threads or torch.get_num_threads()
        print(f"# fresh tensors of 4 KiB-{args.max_bytes >> 20} MiB, hocc all_reduce auto, {world} ranks "
              f"({args.topology}), torch threads {threads}, {args.calls} calls x {args.rounds} rounds per mode, "
              f"on: HOCC_MALLOC_TRIM_S={args.interval}, "
              f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
        print(f"# {'trim':<6} {'ms/call':>9} {'x off':>7} {'RSS MiB':>9}")
        for m in MODES:
            print(f"  {m:<6} {secs[m] * 1e3:>9.3f} {secs[m] / secs['off']:>7.3f} {mib[m]:>9.0f}")
        if out:
            Path(out).write_text(json.dumps({"world": world, "topology": args.topology, "threads": threads,
                                             "calls": args.calls, "rounds": args.rounds, "interval_s": args.interval,
                                             "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
                                             "max_bytes": args.max_bytes, "seconds_per_call": secs,
                                             "rss_mib": mib}, indent=1))
    hocc.reset_engines()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--topology", default="2x2")
    ap.add_argument("--calls", type=int, default=200, help="calls per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per mode, alternated")
    ap.add_argument("--max-bytes", type=int, default=4 << 20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    ap.add_argument("--interval", type=float, default=1.0, help="HOCC_MALLOC_TRIM_S when on (1: the default)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    start_local_ranks(_rank, (args.nprocs, free_port(), args, args.json), args.nprocs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
