#!/usr/bin/env python3
"""FSDP2 and HSDP (torch.distributed.fsdp.fully_shard) on device meshes of the "hocc" backend, on CPU.

    HOCC_TOPOLOGY=2x2 torchrun --standalone --nproc-per-node 4 examples/fsdp.py

With `dist.init_process_group("hocc")`, the groups of a DeviceMesh are hocc
groups, each planning for its own part of the cluster, and fully_shard's
all-gathers, reduce-scatters and all-reduces run through hocc. Two runs of a
tiny MLP, each layer its own unit:

- FSDP: a 1-D mesh of every rank; parameters sharded over all of them.
- HSDP: a 2-D mesh (replicate x shard) = (hosts x ranks per host): parameters
  sharded inside each host, replicated across hosts; gradients are
  reduce-scattered inside a host, then all-reduced across hosts (the slow
  links carry only a shard). The hosts are hocc's: HOCC_TOPOLOGY=2x2 makes
  the 4 local ranks 2 hosts of 2 (without it, hosts come from hostnames).

Each run trains a few SGD steps, each rank on a batch of its own, then checks
the full parameters against the same model trained in one process on all
ranks' batches at once; the job exits non-zero where they differ. Rank 0
prints its loss and the last plan hocc ran on each mesh dimension.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from ddp import batch, make_model  # the same model and data as examples/ddp.py
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import hocc


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, log: str = "") -> None:
    """SGD steps; prints each step's loss if `log` names the run."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward(loss)  # loss.backward(); fully_shard reduce-scatters (HSDP: and all-reduces) grads
        opt.step()
        if log:
            print(f"{log} step {step}  loss {loss.item():.4f}", flush=True)


def full_parameters(model: nn.Module) -> list[torch.Tensor]:
    """A sharded parameter is a DTensor: full_tensor() all-gathers it."""
    return [p.full_tensor().detach() if isinstance(p, DTensor) else p.detach() for p in model.parameters()]


def shard(mesh: DeviceMesh) -> nn.Module:
    """The model with each Linear a unit of its own, then the root (FSDP2's usual wrapping)."""
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="samples per rank")
    p.add_argument("--lr", type=float, default=0.5)
    a = p.parse_args()

    dist.init_process_group("hocc")
    rank, world = dist.get_rank(), dist.get_world_size()

    # the reference, without communication: one model, every rank's batch at once
    ref = make_model()
    xs, ys = zip(*(batch(r, a.batch) for r in range(world)), strict=True)
    train(ref, torch.cat(xs), torch.cat(ys), a.steps, a.lr)
    want = full_parameters(ref)

    # the hosts as hocc sees them (HOCC_TOPOLOGY, or the ranks' hostnames)
    hosts = dist.group.WORLD.hocc_engine(torch.device("cpu")).topology.host_groups()  # type: ignore[union-attr]
    meshes = {"FSDP": init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))}
    if len({len(h) for h in hosts}) == 1:  # HSDP needs equal hosts: row h of the mesh is host h's ranks
        meshes["HSDP"] = DeviceMesh("cpu", torch.tensor(hosts), mesh_dim_names=("replicate", "shard"))
    elif rank == 0:
        print(f"# hosts of unequal sizes {[len(h) for h in hosts]}: no HSDP mesh")

    failed = 0
    for name, mesh in meshes.items():
        if rank == 0:
            print(f"# {name} on mesh {mesh.mesh.tolist()} {mesh.mesh_dim_names}", flush=True)
        model = shard(mesh)
        train(model, *batch(rank, a.batch), a.steps, a.lr, log=name if rank == 0 else "")
        for i, dim in enumerate(mesh.mesh_dim_names or ()):
            plan = hocc.last_plan(mesh.get_group(dim))  # this rank's last call on that dimension's group
            if rank == 0:
                print(f"#   last call on '{dim}' ({mesh.size(i)} ranks): "
                      f"{plan.summary() if plan else 'none through hocc'}", flush=True)
        got = full_parameters(model)
        diff = max((x - y).abs().max().item() for x, y in zip(got, want, strict=True))
        if diff > 1e-5:
            failed += 1
            print(f"rank {rank}: {name} parameters differ from the reference by {diff:.3g}", flush=True)

    flag = torch.tensor([failed])
    dist.all_reduce(flag)
    if rank == 0:
        print(f"{' and '.join(meshes)} parameters match the single-process reference on every rank"
              if flag.item() == 0 else f"{int(flag.item())} runs differ from the reference", flush=True)
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
