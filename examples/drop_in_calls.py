#!/usr/bin/env python3
"""hocc's drop-in collectives next to torch.distributed's own, on CPU.

    HOCC_TOPOLOGY=2x2 torchrun --standalone --nproc-per-node 4 examples/drop_in_calls.py
    HOCC_TOPOLOGY=2x2 torchrun --standalone --nproc-per-node 4 examples/drop_in_calls.py --backend hocc

`hocc.all_reduce`, `hocc.all_gather_into_tensor` and `hocc.reduce_scatter_tensor`
take torch.distributed's arguments plus `algo` ("native", "ring", "ho_ring",
"auto"). Each call below runs under every algo and is checked against the
same call of torch.distributed on gloo; `hocc.plan_for` shows the plan a call
would run, `hocc.last_plan` the one that ran. HOCC_TOPOLOGY=2x2 makes the 4
local ranks look like 2 hosts of 2 ranks (leave it out: hocc groups the
ranks by hostname, here one host).

With `--backend gloo` (default) the default group is gloo and hocc's calls
run on it. With `--backend hocc` the default group is hocc's backend, so
`dist.all_reduce` itself goes through hocc; the reference then runs on a gloo
group of the same ranks. Rank 0 prints one line per call; any rank whose
result differs from gloo's makes the job exit non-zero.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.distributed as dist

import hocc

ALGOS = ("native", "ring", "ho_ring", "auto")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("gloo", "hocc"), default="gloo", help="the default group's backend")
    p.add_argument("--count", type=int, default=1000, help="elements per rank")
    a = p.parse_args()

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.group.WORLD if a.backend == "gloo" else dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(a.count, generator=gen)  # this rank's data
    blocks = torch.randn(a.count * world, generator=gen)  # reduce_scatter's input: one block per rank

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    say(f"# {world} ranks, default group: {a.backend}, {a.count} float32 per rank")
    for n in (a.count, 1 << 22):  # what auto would run, without running it: the pick changes with the size
        say(f"# auto's plan for {n} floats (plan_for): {hocc.plan_for('all_reduce', torch.empty(n)).summary()}")

    # torch.distributed's results on gloo: the reference
    ref_ar = x.clone()
    dist.all_reduce(ref_ar, group=gloo)
    ref_ag = torch.empty(a.count * world)
    dist.all_gather_single(ref_ag, x, group=gloo)
    ref_rs = torch.empty(a.count)
    dist.reduce_scatter_single(ref_rs, blocks, group=gloo)

    def all_reduce(algo: str) -> torch.Tensor:
        t = x.clone()
        hocc.all_reduce(t, op=dist.ReduceOp.SUM, algo=algo)  # in place, as dist.all_reduce
        return t

    def all_gather_into_tensor(algo: str) -> torch.Tensor:
        out = torch.empty(a.count * world)
        work = hocc.all_gather_into_tensor(out, x, async_op=True, algo=algo)  # a Work, as torch's
        assert work is not None
        work.wait()
        return out

    def reduce_scatter_tensor(algo: str) -> torch.Tensor:
        out = torch.empty(a.count)
        hocc.reduce_scatter_tensor(out, blocks, algo=algo)
        return out

    calls: list[tuple[Callable[[str], torch.Tensor], torch.Tensor]] = [
        (all_reduce, ref_ar), (all_gather_into_tensor, ref_ag), (reduce_scatter_tensor, ref_rs)]
    failed = 0
    for fn, ref in calls:
        for algo in ALGOS:
            got = fn(algo)
            plan = hocc.last_plan()  # what this rank just ran
            assert plan is not None
            ok = torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
            if not ok:
                failed += 1
                print(f"rank {rank}: {fn.__name__} algo={algo} differs from gloo by "
                      f"{(got - ref).abs().max().item():.3g}", flush=True)
            say(f"{fn.__name__:<22} algo={algo:<7} {'matches gloo' if ok else 'DIFFERS'}  ran: {plan.summary()}")

    # through the backend, torch's own call is hocc's: dist.all_reduce on the default group
    if a.backend == "hocc":
        t = x.clone()
        dist.all_reduce(t)
        plan = hocc.last_plan()
        ok = torch.allclose(t, ref_ar, rtol=1e-5, atol=1e-5) and plan is not None
        failed += not ok
        say(f"{'dist.all_reduce':<22} on hocc        {'matches gloo' if ok else 'DIFFERS'}  "
            f"ran: {plan.summary() if plan else None}")

    # every rank learns whether any rank failed, so all exit alike
    flag = torch.tensor([failed])
    dist.all_reduce(flag, group=gloo)
    say("all calls match gloo" if flag.item() == 0 else f"{int(flag.item())} results differ from gloo")
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
