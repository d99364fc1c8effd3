"""The shared-memory transport alone (no torch.distributed, no Python engine):
N processes on one host run one op through hocc._C.ShmComm, for each wait
strategy and piece size. Prints median ms per op (the slowest rank's) and the
time ranks spent waiting at barriers. Used to choose HOCC_SHM_WAIT and
HOCC_SHM_PIECE_BYTES (bench/results/shm.md).

    .venv/bin/python bench/shm_microbench.py --op all_reduce --sizes 1M,16M,64M
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
import uuid

import torch

from hocc import executor
from hocc.bench.sizes import parse_size


def _rank(me: int, n: int, path: str, piece: int, wait: str, nbytes: int, iters: int, op: str, q: mp.Queue) -> None:
    torch.set_num_threads(1)
    comm = executor.load().ShmComm(path, me, n, piece, 60.0, wait)
    x = torch.ones(nbytes // 4)
    times = []
    for _ in range(iters + 1):  # the first is a warm-up
        start = time.perf_counter()
        if op == "all_reduce":
            comm.all_reduce(x.data_ptr(), x.numel(), "float32", "sum")
        elif op == "all_gather":
            comm.all_gather(x.data_ptr(), x.numel() // n, "float32")
        else:
            comm.reduce_scatter(x.data_ptr(), x.numel() // n, "float32", "sum")
        times.append(time.perf_counter() - start)
    timed = sorted(times[1:])
    q.put((timed[len(timed) // 2], comm.wait_seconds / (iters + 1)))


def measure(n: int, op: str, nbytes: int, piece: int, wait: str, iters: int) -> tuple[float, float]:
    path = f"/dev/shm/hocc-bench-{uuid.uuid4().hex}"
    with open(path, "wb") as f:
        f.truncate(executor.load().ShmComm.segment_bytes(n, piece))
    try:
        q: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_rank, args=(r, n, path, piece, wait, nbytes, iters, op, q)) for r in range(n)]
        for p in procs:
            p.start()
        res = [q.get(timeout=300) for _ in procs]
        for p in procs:
            p.join()
    finally:
        os.unlink(path)
    return max(r[0] for r in res), sum(r[1] for r in res) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--op", default="all_reduce,reduce_scatter,all_gather")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--pieces", default="128K,256K,1M")
    ap.add_argument("--waits", default="futex,hybrid,yield,sleep")
    ap.add_argument("-n", "--iters", type=int, default=5)
    args = ap.parse_args()
    print("| op | size | piece | " + " | ".join(f"{w} ms (waiting)" for w in args.waits.split(",")) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in args.waits.split(",")) + " |")
    for op in args.op.split(","):
        for size in map(parse_size, args.sizes.split(",")):
            for piece in map(parse_size, args.pieces.split(",")):
                cells = []
                for wait in args.waits.split(","):
                    t, waited = measure(args.ranks, op, size, piece, wait, args.iters)
                    cells.append(f"{t * 1e3:.1f} ({waited * 1e3:.1f})")
                print(f"| {op} | {size >> 10} KiB | {piece >> 10} KiB | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
