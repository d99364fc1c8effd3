#!/usr/bin/env python3
"""DistributedDataParallel on the "hocc" backend, on CPU.

    HOCC_TOPOLOGY=2x2 torchrun --standalone --nproc-per-node 4 examples/ddp.py

`import hocc` registers the backend; `dist.init_process_group("hocc")` is the
only change to a DDP script. DDP's gradient all-reduces then run through
hocc's planner (gloo carries the bytes between CPU processes). A tiny MLP
trains a few SGD steps, each rank on a batch of its own; then every rank
checks its parameters against the same model trained in this one process on
all ranks' batches at once (what DDP must compute), and the job exits
non-zero if they differ. Rank 0 prints its loss and the plan of DDP's last
all-reduce.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hocc


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank and in the reference
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def batch(rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data: inputs x and targets y = a fixed linear map of x, plus noise."""
    teacher = torch.randn(32, 4, generator=torch.Generator().manual_seed(7)) / 32**0.5
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(size, 32, generator=g)
    return x, x @ teacher + 0.1 * torch.randn(size, 4, generator=g)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, log: bool = False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward(loss)  # loss.backward(); DDP all-reduces (averages) the gradients here
        opt.step()
        if log:
            print(f"step {step}  loss {loss.item():.4f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=16, help="samples per rank")
    p.add_argument("--lr", type=float, default=0.5)
    a = p.parse_args()

    dist.init_process_group("hocc")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = DDP(make_model())  # on the default group: hocc
    train(model, *batch(rank, a.batch), a.steps, a.lr, log=rank == 0)
    plan = hocc.last_plan()
    if rank == 0:
        print(f"# DDP's last gradient all-reduce: {plan.summary() if plan else 'none through hocc'}")

    # the reference, without communication: one model, every rank's batch at once
    # (the mean loss over all of them has the average of the ranks' gradients)
    ref = make_model()
    xs, ys = zip(*(batch(r, a.batch) for r in range(world)), strict=True)
    train(ref, torch.cat(xs), torch.cat(ys), a.steps, a.lr)
    diff = max((x - y).abs().max().item() for x, y in zip(model.module.parameters(), ref.parameters(), strict=True))
    ok = diff < 1e-5 and plan is not None and plan.collective == "all_reduce"
    if not ok:
        print(f"rank {rank}: parameters differ from the reference by {diff:.3g}; "
              f"last hocc plan: {plan.summary() if plan else None}", flush=True)

    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)  # through hocc too
    if rank == 0:
        print("parameters match the single-process reference on every rank" if flag.item() == 0
              else f"{int(flag.item())} ranks differ from the reference", flush=True)
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
