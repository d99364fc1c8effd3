"""What a new user's short job sees: hocc with its defaults (auto, trials
as they come) from the first call, against the same job on gloo, each on a
fresh process group. Three jobs:

- `dist.all_reduce` of --size on a "hocc" group, --calls calls;
- DDP over --steps steps: on a "hocc" group, and on gloo with
  `hocc.ddp_comm_hook`;
- FSDP2 (`fully_shard`) over --steps steps on a "hocc" group.

Each job's wall time is the slowest rank's, its first call (communicator
set-up, any trials) included; gloo runs the same job right before. Run one
process per rank under a launcher; rank 0 prints one JSON line per job:

    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/first_calls.py
    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/first_calls.py -- --no-topology

--no-topology drops the launcher's HOCC_TOPOLOGY, so hocc detects the hosts
itself (by hostname: bench/cluster.py gives each emulated host its own), as a
user who sets nothing gets."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from hocc.bench.runner import slowest
from hocc.bench.sizes import parse_size


def _timed(job: Callable[[], None]) -> float:
    dist.barrier()
    start = time.perf_counter()
    job()
    return slowest(time.perf_counter() - start)


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])


def _train(model: nn.Module, steps: int, width: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64M", help="bytes per all_reduce call (default 64M)")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="training steps of the DDP and FSDP2 jobs")
    p.add_argument("--width", type=int, default=1024, help="the model: 4 square Linear layers this wide")
    p.add_argument("--jobs", default="all_reduce,ddp,ddp_hook,fsdp2")
    p.add_argument("--no-topology", action="store_true", help="let hocc detect the hosts (drop HOCC_TOPOLOGY)")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    if a.no_topology:
        os.environ.pop("HOCC_TOPOLOGY", None)
    spec = os.environ.get("HOCC_TOPOLOGY")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import hocc  # registers the backend; hocc.ddp_comm_hook below

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = parse_size(a.size) // 4
    jobs = a.jobs.split(",")

    def report(job: str, gloo_s: float, hocc_s: float, **extra: object) -> None:
        if rank == 0:
            print(json.dumps({"job": job, "tag": a.tag, "world": world, "topology": spec or "detected",
                              "gloo_s": round(gloo_s, 4), "hocc_s": round(hocc_s, 4),
                              "x_gloo": round(gloo_s / hocc_s, 3), **extra}), flush=True)

    warm = dist.new_group(backend="gloo")  # the process's one-time costs (torch's lazy set-up) charged to no job
    _train(nn.parallel.DistributedDataParallel(_model(8), process_group=warm), 1, 8)
    if "all_reduce" in jobs:
        x = torch.ones(n)

        def calls(group: dist.ProcessGroup) -> Callable[[], None]:
            def run() -> None:
                for _ in range(a.calls):
                    dist.all_reduce(x, group=group)
            return run

        g = _timed(calls(dist.new_group(backend="gloo")))
        h = _timed(calls(dist.new_group(backend="hocc")))
        report("all_reduce", g, h, size=a.size, calls=a.calls)
    if "ddp" in jobs or "ddp_hook" in jobs:
        def ddp(group: dist.ProcessGroup, hook: bool = False) -> Callable[[], None]:
            def run() -> None:
                model = nn.parallel.DistributedDataParallel(_model(a.width), process_group=group)
                if hook:
                    model.register_comm_hook(None, hocc.ddp_comm_hook)
                _train(model, a.steps, a.width)
            return run

        g = _timed(ddp(dist.new_group(backend="gloo")))
        if "ddp" in jobs:
            report("ddp", g, _timed(ddp(dist.new_group(backend="hocc"))), steps=a.steps, width=a.width)
        if "ddp_hook" in jobs:
            report("ddp_hook", g, _timed(ddp(dist.new_group(backend="gloo"), hook=True)), steps=a.steps,
                   width=a.width)
    if "fsdp2" in jobs:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        def fsdp(group: dist.ProcessGroup) -> Callable[[], None]:
            def run() -> None:
                model = _model(a.width)
                mesh = DeviceMesh.from_group(group, "cpu")
                for layer in model.children():
                    if isinstance(layer, nn.Linear):
                        fully_shard(layer, mesh=mesh)
                fully_shard(model, mesh=mesh)
                _train(model, a.steps, a.width)
            return run

        fsdp(warm)()
        g = _timed(fsdp(dist.new_group(backend="gloo")))
        report("fsdp2", g, _timed(fsdp(dist.new_group(backend="hocc"))), steps=a.steps, width=a.width)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
