"""hocc tune: measure auto's choices ahead of a job, on the ranks the job will
use, and write them to a tuning file that the job then loads
(HOCC_TUNING_FILE) without measuring anything it covers. Runs under torchrun:

    torchrun --nproc-per-node 8 --no-python hocc tune --file tuning.json
    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 --no-python hocc tune --file t.json --max-bytes 64M

Each size bucket from --min-bytes to --max-bytes (per-rank bytes, powers of
two) of each collective runs its trials (hocc/engine/tuning.py); rank 0
prints every bucket's measured times, the pick, the calls and seconds the
trials took, and the cost model fitted to them."""

from __future__ import annotations

import argparse
import os
import time

from hocc.bench.sizes import parse_size
from hocc.plan.crossover import bucket_of, bucket_range
from hocc.plan.types import COLLECTIVES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", required=True, help="the tuning file to write (merged into if it exists)")
    p.add_argument("--ops", default=",".join(COLLECTIVES), help="collectives to tune (default: all three)")
    p.add_argument("--min-bytes", default="4", help="smallest per-rank size (default 4)")
    p.add_argument("--max-bytes", default="64M", help="largest per-rank size (default 64M)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="tensors on (default cpu: gloo)")


def run(a: argparse.Namespace) -> int:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("hocc tune runs on the job's ranks: start it under torchrun, e.g. "
                         "torchrun --nproc-per-node 8 --no-python hocc tune --file tuning.json")
    import torch
    import torch.distributed as dist

    import hocc
    from hocc.bench.collectives import COLLECTIVES as BENCH
    from hocc.engine.group_engines import get_engine
    from hocc.executor.cpp_form import dtype_name

    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad:
        raise ValueError(f"--ops: unknown collectives {bad}; use {', '.join(COLLECTIVES)}")
    dtype = getattr(torch, a.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"--dtype {a.dtype!r} is not a torch dtype")
    lo, hi = parse_size(a.min_bytes), parse_size(a.max_bytes)
    device = torch.device("cpu")
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    hocc.configure(tuning_file=a.file, tune=True, algo="auto")
    rank, world = dist.get_rank(), dist.get_world_size()
    engine = get_engine(dist.group.WORLD, device)  # type: ignore[arg-type]
    tuner = engine.tuner()
    tuner.measure_all()  # ahead of a job: every candidate, not only those the model cannot tell apart
    elem = torch.empty((), dtype=dtype).element_size()
    rows: list[str] = []
    total = time.perf_counter()
    for op in ops:
        size = max(lo, elem)
        while size <= hi:
            count = max(1, size // elem)
            coll = BENCH[op]  # buffers of nccl-tests' size S: the whole all_gather output / reduce_scatter input
            x, out = coll.buffers(count * elem * (1 if op == "all_reduce" else world), dtype, world, rank, device)
            key = (op, dtype_name(dtype), bucket_of(count * elem))
            calls, start = 0, time.perf_counter()
            while key not in tuner.decided() and calls < 500:
                coll.launch(x, out, "sum", "auto")
                calls += 1
            secs = time.perf_counter() - start
            pick = tuner.decided().get(key)
            if pick is not None:
                label = f"{pick.algo}@{pick.chunks}" if pick.chunks else pick.algo
                rows.append(f"{op:<15} {bucket_range(key[2]):<22} {label:<12} {calls:>5} {secs:>8.2f}  {pick.why}")
            size *= 2
    if rank == 0:
        print(f"# hocc tune: {world} ranks, {engine.topology.shape()}, {a.dtype}, {a.device}; file {a.file}")
        print(f"# {'op':<15} {'per-rank bytes':<22} {'pick':<12} {'calls':>5} {'seconds':>8}  measured")
        print("\n".join(rows))
        fit = tuner.file.fit(tuner.key) if tuner.file is not None else None
        if fit:
            print(f"# fitted model: efficiency {fit['efficiency']}, latency {fit['latency']}, "
                  f"rms log error {fit['rms_log']:.3f}")
        print(f"# {time.perf_counter() - total:.1f} s in all")
    dist.destroy_process_group()
    return 0

