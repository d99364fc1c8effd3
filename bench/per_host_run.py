"""Large calls timed as a training job meets them: torch processes, one per
rank (one thread each), each sample (a call, or --burst calls back to back:
small ones) begun together after a barrier (each library's own; the ways'
order rotates from sample to sample), gloo's own
call interleaved with hocc's algorithms call by call (or after them:
--gloo-apart), fresh-looking tensors
(the same ones reused, as a training loop reuses its buckets), medians of
--iters after --warmup, the slowest rank's time (each rank's times are
reduced once a size's samples are done, not by a call between samples). Run one process per rank
under a launcher (bench/cluster.py --script, torchrun); rank 0 prints one JSON
line per (op, way):

    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/per_host_run.py -- --size 64M --ops all_reduce

hocc-bench differs on purpose: back-to-back iterations of one algorithm, no
barrier between them, rank 0's time (nccl-tests' way). bench/regression.py
runs this script for two commits side by side (docs/testbed.md); bench/ompi_peer.py
runs it for a sweep of sizes (--size as a comma list, --iters and --warmup one
per size, --decide-auto, --out) beside Open MPI's own collectives, timed the
same way (bench/ompi_collectives.py)."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import hocc
from hocc.bench.collectives import COLLECTIVES
from hocc.bench.runner import BenchSpec
from hocc.bench.sizes import parse_size

# the emulated cluster's helpers (stdlib only), by path: bench/regression.py runs this script with an older
# checkout's hocc on PYTHONPATH, which may not have hocc.bench.emulated
_emulated = runpy.run_path(str(Path(__file__).resolve().parents[1] / "hocc" / "bench" / "emulated.py"))
nic_tx_bytes, per_size = _emulated["nic_tx_bytes"], _emulated["per_size"]


def _gloo(op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
    """gloo's own call, the baseline (hocc's calls go through hocc-bench's BenchCollective.launch)."""
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="16M", help="bytes per call, as hocc-bench's -b (K, M, G); a comma list runs "
                                                 "each size in turn (ops outer, sizes inner)")
    p.add_argument("--ops", default="all_reduce", help="comma list of all_reduce, all_gather, reduce_scatter")
    p.add_argument("--algos", default="ho_ring", help="hocc's ways, comma list (gloo's own call always runs)")
    p.add_argument("--iters", default="3", help="timed calls: one number, or one per size")
    p.add_argument("--warmup", default="1", help="warm-up samples: one number, or one per size")
    p.add_argument("--burst", default="1", help="calls per sample, back to back after its barrier: one number, or "
                                                "one per size (a sample's time is its burst's over its calls)")
    p.add_argument("--decide-auto", action="store_true",
                   help="before a size's calls, call auto until it has decided the size's bucket (its trials, as "
                        "hocc-bench does), so the timed calls are auto as a user meets it after them")
    p.add_argument("--gloo-apart", action="store_true",
                   help="gloo's samples after hocc's ways' samples of each size, not rotated among them: no gloo "
                        "call comes between two of hocc's samples (on the emulated cluster one gloo call made the "
                        "next 20 small hocc calls 2.5x slower; bench/results/peers/small/notes.md)")
    p.add_argument("--out", help="rank 0 also appends its JSON lines to this file")
    p.add_argument("--tag", default="", help="copied into each JSON line (e.g. the commit)")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [parse_size(x) for x in a.size.split(",")]
    iters, warmups, bursts = (per_size(v, len(sizes), "per_host_run.py") for v in (a.iters, a.warmup, a.burst))
    ways = ["gloo", *a.algos.split(",")]
    cpu = torch.device("cpu")
    token = torch.zeros(1)  # hocc's barrier before each sample of hocc's (below)
    for op in a.ops.split(","):
        coll = COLLECTIVES[op]  # nccl-tests' sizes and data, as hocc-bench's
        for nbytes, n_iter, n_warm, burst in zip(sizes, iters, warmups, bursts, strict=True):
            inp, out = coll.buffers(nbytes, torch.float32, world, rank, cpu)
            fresh = inp.clone()
            trial_calls = None
            if a.decide_auto and "auto" in ways:
                from hocc.bench.runner import _until_decided  # here: bench/regression.py's base commits lack it

                spec = BenchSpec((op,), (nbytes,), ("auto",), torch.float32, "sum", n_iter, n_warm, 0, 3)
                trial_calls, _ = _until_decided(coll, nbytes, spec, cpu)
                if op == "all_reduce":
                    inp.copy_(fresh)
            mine: dict[str, list[float]] = {w: [] for w in ways}  # this rank's seconds per call, every sample
            sent: dict[str, list[int]] = {w: [] for w in ways}  # bytes rank 0's host NIC sent per call
            ran: dict[str, str] = {}

            turn = ways[1:] if a.gloo_apart else ways  # the ways that rotate sample by sample
            n = n_warm + n_iter
            order = [(w, it) for it in range(n) for w in turn[it % len(turn):] + turn[:it % len(turn)]]
            if a.gloo_apart:  # gloo's samples after hocc's: no gloo call between two of hocc's samples
                order += [("gloo", it) for it in range(n)]
            for way, it in order:  # rotated: no way always follows another
                tx0 = nic_tx_bytes() if rank == 0 else None
                if way == "gloo":  # each library's own barrier, as Open MPI's side uses MPI_Barrier: gloo's
                    dist.barrier()  # leaves the ranks milliseconds apart on the emulated cluster, and that
                else:  # spread would be timed as the first call's (an all-reduce is a barrier too)
                    hocc.all_reduce(token)
                t0 = time.perf_counter()
                for _ in range(burst):
                    if way == "gloo":
                        _gloo(op, inp, out)
                    else:
                        coll.launch(inp, out, "sum", way)
                mine[way].append((time.perf_counter() - t0) / burst)
                if it >= n_warm:
                    tx1 = nic_tx_bytes() if tx0 is not None else None
                    if tx0 is not None and tx1 is not None:
                        sent[way].append((tx1 - tx0) // burst)
                if way != "gloo":
                    plan = hocc.last_plan(device="cpu")
                    ran[way] = plan.algo if plan is not None else way
                if op == "all_reduce":
                    inp.copy_(fresh)  # in place: keep the values bounded

            times: dict[str, list[float]] = {}
            for way in ways:  # a sample's time is its slowest rank's, reduced once the samples are done
                slowest = torch.tensor(mine[way], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times[way] = slowest.tolist()[n_warm:]
            if rank == 0:
                for way in ways:
                    row = {"tag": a.tag, "op": op, "size": max(inp.numel(), out.numel()) * inp.element_size(),
                           "way": way, "world": world, "median_s": statistics.median(times[way]),
                           "times_s": times[way]}
                    if way in ran:
                        row["ran"] = ran[way]
                    if sent[way]:
                        row["nic_tx_per_call"] = statistics.median(sent[way])
                    if way == "auto" and trial_calls is not None:
                        row["trial_calls"] = trial_calls
                    print(json.dumps(row), flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    hocc.reset_engines()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
