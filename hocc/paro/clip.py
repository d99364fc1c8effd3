"""Gradient clipping over a PaRO model: the global norm from the shards.

After a synced backward each rank holds its optimizer-scope shard of every
gradient: at o = N all of it, at o = I its intra-group position's part (the
members of one intra-group hold disjoint parts, the rails repeat them), at
o = G a part no other rank holds. So a unit's shards are summed over nothing,
the intra-group, or the world, by its scope.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from hocc.paro.shard import Pass


def grad_norm(p: Pass, norm_type: float = 2.0) -> torch.Tensor:
    """The norm of the whole model's gradient (fp32, on every rank)."""
    norm_type = float(norm_type)
    inf = math.isinf(norm_type)
    dev = p.units[0].device
    parts = {s: torch.zeros((), dtype=torch.float32, device=dev) for s in "NIG"}
    for u in p.units:
        for sp in u.sharded:
            if sp.grad is None or not sp.grad.numel():
                continue
            g = sp.grad.detach().float()
            acc = parts[u.strategy.optim]
            if inf:
                torch.maximum(acc, g.abs().max(), out=acc)
            else:
                acc += g.abs().pow(norm_type).sum()
    op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
    groups = p.units[0].groups
    if groups.group_size > 1:
        dist.all_reduce(parts["I"], op=op, group=groups.host)
    if groups.size > 1:
        dist.all_reduce(parts["G"], op=op, group=groups.world)
    if inf:
        return torch.stack(list(parts.values())).max()
    return (parts["N"] + parts["I"] + parts["G"]).pow(1.0 / norm_type)


def clip_grad_norm_(p: Pass, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)), as torch's
    clip_grad_norm_ does; returns the norm before clipping."""
    total = grad_norm(p, norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for u in p.units:
        for sp in u.sharded:
            if sp.grad is not None:
                sp.grad.detach().mul_(coef.to(sp.grad.dtype))
    return total
