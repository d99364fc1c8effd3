#!/usr/bin/env python3
"""FSDP2 (torch.distributed.fsdp.fully_shard) with torch.distributed.checkpoint on the given backend, on CPU.

    torchrun --standalone --nproc-per-node 4 tests/frameworks/fsdp_dcp.py --backend hocc --out DIR

Three Adam steps of a sharded model (each rank a batch of its own), then its state (model and optimizer)
checkpointed three ways: dcp.save, dcp.async_save (a future, waited on), and a full state dict
(get_state_dict's full_state_dict=True, cpu_offload=True: whole tensors on rank 0 only), written by rank 0
with torch.save. Two more steps give "continuous". Then a fresh model (another seed) and optimizer are
loaded from each checkpoint, dcp.load from the sharded ones, set_model_state_dict / set_optimizer_state_dict
with full_state_dict=True, broadcast_from_rank0=True from the full one (only rank 0 reads the file), and
each takes the same two steps: all three must end where "continuous" does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from common import CLASSES, FEATURES, Params, full_params, main, make_model
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import hocc  # noqa: F401  registers the "hocc" backend

BATCH = 8


def sharded(mesh: DeviceMesh, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def steps(model: nn.Module, opt: torch.optim.Optimizer, first: int, count: int) -> list[float]:
    """Steps first .. first+count-1; each rank's batch depends on the step and the rank. The losses averaged
    over the ranks."""
    losses = []
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x = torch.randn(BATCH, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (BATCH,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / dist.get_world_size())
    return losses


def run(backend: str, out: Path) -> tuple[Params, dict[str, Any]]:
    if not dist.is_initialized():  # (run_all.py may have made it)
        dist.init_process_group(backend)
    assert dist.get_backend() == backend, dist.get_backend()
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, opt = sharded(mesh, seed=0)
    metrics = {"steps_0_2": steps(model, opt, 0, 3)}

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out / "sync")
    future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out / "async")
    future.result()
    full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                                  cpu_offload=True))
    full_file = out / "full.pt"
    if rank == 0:
        assert full_model and full_optim, "full_state_dict with cpu_offload: the whole state on rank 0"
        torch.save({"model": full_model, "optim": full_optim}, full_file)
    dist.barrier()
    del full_model, full_optim

    metrics["continuous/steps_3_4"] = steps(model, opt, 3, 2)
    params = {"continuous": full_params(model)}

    for tag in ("sync", "async"):
        m, o = sharded(mesh, seed=1)
        model_sd, optim_sd = get_state_dict(m, o)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=out / tag)
        set_state_dict(m, o, model_state_dict=state["model"], optim_state_dict=state["optim"])
        metrics[f"{tag}/steps_3_4"] = steps(m, o, 3, 2)
        params[tag] = full_params(m)

    m, o = sharded(mesh, seed=1)
    full = torch.load(full_file, weights_only=True) if rank == 0 else {"model": {}, "optim": {}}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(m, full["model"], options=options)
    set_optimizer_state_dict(m, o, full["optim"], options=options)
    metrics["full/steps_3_4"] = steps(m, o, 3, 2)
    params["full"] = full_params(m)

    return params, metrics


if __name__ == "__main__":
    main(run)
