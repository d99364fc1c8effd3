"""Open MPI's own collectives, timed as bench/per_host_run.py times hocc's and
gloo's: one process per rank under mpirun (bench/ompi_peer.py starts it on the
emulated cluster), float32 buffers of nccl-tests' sizes (the all-reduce
buffer, the all-gather output, the reduce-scatter input), every sample (a
call, or --burst calls back to back) begun together after a barrier, the
slowest rank's time per call (max over ranks), the median of the timed
samples after the warm-ups. Rank 0 appends one JSON line
per (op, size) to --out.

Runs in the benchmark's own environment (mpi4py and numpy, no torch, no hocc):

    mpirun -np 8 ... build/ompi-venv/bin/python bench/ompi_collectives.py --sizes 32,1048576 --iters 20,5 ...

MPI_Allreduce and MPI_Reduce_scatter_block run out of place (OSU's and IMB's
way); all inputs are small integers, so a float32 sum is exact and one call on
fresh inputs is checked against the exact answer. Rank 0 also counts the bytes its
host's NIC sent per timed call (barrier and timing included): how much each
algorithm puts on the shaped link, and proof that it crosses it."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import socket
import statistics
from pathlib import Path

import numpy as np
from mpi4py import MPI

# hocc/bench/emulated.py is stdlib only, and this venv has no hocc (nor torch): that one file, run by path
_emulated = runpy.run_path(str(Path(__file__).resolve().parents[1] / "hocc" / "bench" / "emulated.py"))
nic_tx_bytes, per_size = _emulated["nic_tx_bytes"], _emulated["per_size"]

OPS = ("all_reduce", "all_gather", "reduce_scatter")  # hocc.plan.types.COLLECTIVES, which this venv cannot import


def values(rank: int, n: int, start: int = 0) -> np.ndarray:
    """Elements start..start+n of `rank`'s input: 1..5, period 5 (as hocc-bench's data)."""
    i = np.arange(start, start + n, dtype=np.int64)
    return ((i * 3 + rank * 7) % 5 + 1).astype(np.float32)


def expected_sum(world: int, n: int, start: int = 0) -> np.ndarray:
    return sum(values(r, n, start).astype(np.float64) for r in range(world)).astype(np.float32)


def buffers(op: str, size: int, world: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    total = max(size // 4, 1)
    if op == "all_reduce":
        return values(rank, total), np.empty(total, np.float32)
    per = max(total // world, 1)
    if op == "all_gather":
        return values(rank, per), np.empty(per * world, np.float32)
    return values(rank, per * world), np.empty(per, np.float32)


def call(comm: MPI.Intracomm, op: str, inp: np.ndarray, out: np.ndarray) -> None:
    if op == "all_reduce":
        comm.Allreduce(inp, out, op=MPI.SUM)
    elif op == "all_gather":
        comm.Allgather(inp, out)
    else:
        comm.Reduce_scatter_block(inp, out, op=MPI.SUM)


def wrong(op: str, out: np.ndarray, world: int, rank: int) -> int:
    n = out.size
    if op == "all_reduce":
        want = expected_sum(world, n)
    elif op == "all_gather":
        per = n // world
        want = np.concatenate([values(r, per) for r in range(world)])
    else:
        want = expected_sum(world, n, start=rank * n)
    return int(np.count_nonzero(out != want))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", required=True, help="bytes, comma list")
    p.add_argument("--iters", required=True, help="timed calls: one number or one per size")
    p.add_argument("--warmup", default="2", help="warm-up samples: one number or one per size")
    p.add_argument("--burst", default="1", help="calls per sample, back to back after its barrier: one number or "
                                                "one per size (a sample's time is its burst's over its calls)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--way", required=True, help="label for the JSON lines (e.g. ompi_tuned, ompi_han)")
    p.add_argument("--out", required=True, help="rank 0 appends its JSON lines here")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    sizes = [int(x) for x in a.sizes.split(",")]
    iters, warmup, bursts = (per_size(v, len(sizes), "ompi_collectives.py") for v in (a.iters, a.warmup, a.burst))
    # where each rank runs: the emulated host is the UTS namespace's hostname, the namespace its addresses
    where = comm.gather((MPI.Get_processor_name(), socket.gethostname(), os.getpid(), os.readlink("/proc/self/ns/net"),
                         os.environ.get("OMPI_MCA_mpi_yield_when_idle")), root=0)  # noqa: SIM112 (Open MPI's name)
    if rank == 0:
        with open(a.out, "a") as f:
            f.write(json.dumps({"way": a.way, "kind": "ranks", "world": world, "ranks": where,
                                "library": MPI.Get_library_version().strip()}) + "\n")
    took = np.zeros(1, np.float64)
    slowest = np.zeros(1, np.float64)
    for op in a.ops.split(","):
        for size, n_iter, n_warm, burst in zip(sizes, iters, warmup, bursts, strict=True):
            inp, out = buffers(op, size, world, rank)
            call(comm, op, inp, out)  # one call on fresh inputs, checked
            bad = comm.allreduce(wrong(op, out, world, rank), op=MPI.SUM)
            times, sent = [], []
            for it in range(n_warm + n_iter):
                tx0 = nic_tx_bytes() if rank == 0 else None
                comm.Barrier()
                t0 = MPI.Wtime()
                for _ in range(burst):
                    call(comm, op, inp, out)
                took[0] = (MPI.Wtime() - t0) / burst
                comm.Allreduce(took, slowest, op=MPI.MAX)  # the slowest rank's time
                if it >= n_warm:
                    times.append(float(slowest[0]))
                    if tx0 is not None:
                        sent.append((nic_tx_bytes() - tx0) // burst)
            if rank == 0:
                nbytes = max(inp.nbytes, out.nbytes)
                row = {"way": a.way, "op": op, "size": nbytes, "world": world, "median_s": statistics.median(times),
                       "times_s": times, "wrong": bad,
                       "nic_tx_per_call": statistics.median(sent) if sent else None}
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"# {a.way} {op} {nbytes} B: {row['median_s'] * 1e6:.1f} us" + (f", {bad} wrong" if bad else ""),
                      flush=True)


if __name__ == "__main__":
    main()
