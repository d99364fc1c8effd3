"""Moves data between the caller's tensors and a plan's work buffer
([chunks][blocks][piece], see hocc.plan.types). The caller's tensors are
read when packing and written only when unpacking, after every step ended:
a failed collective leaves them as they were."""

from __future__ import annotations

import torch

from hocc.plan.types import Layout


def _padded_blocks(flat: torch.Tensor, lay: Layout, blocks: int) -> torch.Tensor:
    """[blocks, chunks*piece] view or copy of `flat` ([blocks*block_elems]), zero-padded."""
    x = flat.view(blocks, lay.block_elems)
    full = lay.chunks * lay.piece
    if full == lay.block_elems:
        return x
    out = torch.zeros(blocks, full, dtype=flat.dtype, device=flat.device)
    out[:, :lay.block_elems] = x
    return out


def pack(collective: str, lay: Layout, inp: torch.Tensor, rank: int, work: torch.Tensor | None = None) -> torch.Tensor:
    """The work buffer holding `inp` (the caller's input, flattened): `work`
    (lay.size elements, e.g. a reused buffer) or a new one."""
    flat = inp.reshape(-1)
    if work is None:
        work = torch.empty(lay.size, dtype=flat.dtype, device=flat.device)
    if collective == "all_reduce":
        work[:flat.numel()] = flat
        work[flat.numel():].zero_()
        return work
    if collective == "reduce_scatter":
        x = _padded_blocks(flat, lay, lay.blocks).view(lay.blocks, lay.chunks, lay.piece)
        order = torch.tensor(lay.order, device=flat.device)
        torch.index_select(x.permute(1, 0, 2), 1, order, out=work.view(lay.chunks, lay.blocks, lay.piece))
        return work
    # all_gather: my block into its position in every chunk; the rest arrives
    work = work.view(lay.chunks, lay.blocks, lay.piece)
    pos = lay.order.index(rank)
    work[:, pos, :] = _padded_blocks(flat, lay, 1).view(lay.chunks, lay.piece)
    return work.view(-1)


def unpack(collective: str, lay: Layout, work: torch.Tensor, out: torch.Tensor, rank: int) -> None:
    """Copy the plan's result from the work buffer into `out` (caller's output)."""
    flat_out = out.view(-1)
    if collective == "all_reduce":
        flat_out.copy_(work[:flat_out.numel()])
        return
    w = work.view(lay.chunks, lay.blocks, lay.piece)
    if collective == "reduce_scatter":
        mine = w[:, lay.order.index(rank), :].reshape(-1)[:lay.block_elems]
        flat_out.copy_(mine)
        return
    blocks = w.permute(1, 0, 2).reshape(lay.blocks, lay.chunks * lay.piece)[:, :lay.block_elems]
    order = torch.tensor(lay.order, device=work.device)
    flat_out.view(lay.blocks, lay.block_elems).index_copy_(0, order, blocks)
