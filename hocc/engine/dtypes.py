"""Reduction ops and dtypes: what hocc accepts, and their names for the executor."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hocc.executor import load

# what the executor reduces and moves (csrc/core/types.h), by its names
DTYPES: tuple[torch.dtype, ...] = tuple(getattr(torch, name) for name in load().DTYPES)
DTYPE_SET = frozenset(DTYPES)  # what a call's check looks up: a tuple's `in` compares up to every dtype
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# what the executor reduces with (hocc._C.OPS: csrc/core/types.h), by torch's ReduceOp of the same name
OP_NAMES = {getattr(dist.ReduceOp, name.upper()): name for name in load().OPS}


def op_name(op: object) -> str:
    """'sum', 'avg', ... for a ReduceOp (or its RedOpType), else ValueError."""
    try:  # a ReduceOp object holding a RedOpType (a backend's opts.reduceOp: comparing it costs 1 us), or one
        name = OP_NAMES.get(op.op if type(op) is dist.ReduceOp else op)  # type: ignore[attr-defined]
    except TypeError:  # unhashable: compared below
        name = None
    if name is not None:
        return name
    for known, name in OP_NAMES.items():
        try:
            if op == known:
                return name
        except TypeError:
            continue
    supported = ", ".join(f"ReduceOp.{n.upper()}" for n in OP_NAMES.values())
    raise ValueError(f"unsupported reduction op {op!r}; hocc supports {supported}")


def premul_factor(op: object) -> float | torch.Tensor | None:
    """PREMUL_SUM's factor (a number or a tensor; dist._make_nccl_premul_sum), else None."""
    if getattr(op, "op", None) == dist.ReduceOp.PREMUL_SUM:
        return op.factor  # type: ignore[attr-defined]
    return None
