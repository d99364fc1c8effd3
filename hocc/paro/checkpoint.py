"""State dicts of a PaRO model: full (gathered) for now; sharded and DCP below."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hocc.paro.shard import ParoModule


def full_state_dict(model: ParoModule) -> dict[str, torch.Tensor]:
    """Every parameter whole, in its own shape and the module's dtype, and
    every buffer, by the names of model.state_dict(); on every rank."""
    p = model._paro_pass
    out: dict[str, torch.Tensor] = {}
    prefix = {id(m): n + "." if n else "" for n, m in model.named_modules()}  # type: ignore[attr-defined]
    for u in p.units:
        flat = torch.empty(u.layout.padded, dtype=u.dtype, device=u.device)
        p.moves.run(partial(u.moves.gather, flat, u.master, u.strategy.optim, "N", "load", "params"))
        base = prefix[id(u.module)]
        for sl in u.slots:
            out[base + sl.fqn] = flat[sl.offset:sl.offset + sl.numel].view(sl.shape).clone()
    for name, b in model.named_buffers():  # type: ignore[attr-defined]
        out[name] = b.detach().clone()
    return out
