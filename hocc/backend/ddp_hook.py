"""A DDP communication hook: keep your backend, let hocc all-reduce the gradients.

    model.register_comm_hook(None, hocc.ddp_comm_hook)          # the default group
    model.register_comm_hook(group, hocc.ddp_comm_hook)         # or any group

Averages like DDP's own all-reduce (sum, then divide by the group size).
"""

# No `from __future__ import annotations`: DDP checks these annotations as objects.
from typing import Any

import torch
import torch.distributed as dist

import hocc.api.collectives as api


def ddp_comm_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state if isinstance(state, dist.ProcessGroup) else None
    size = dist.get_world_size(group)
    work = api.all_reduce(bucket.buffer(), group=group, async_op=True)
    assert work is not None

    def average(fut: torch.futures.Future[Any]) -> torch.Tensor:
        return fut.value()[0].div_(size)

    return work.get_future().then(average)
