"""Checks every call makes before any byte moves. Each error names the
problem and the fix."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from hocc.config import algo_choices
from hocc.engine.dtypes import DTYPE_SET, DTYPES, op_name


class HoccError(ValueError):
    """Bad input to a hocc call (raised before any communication)."""


def check_initialized(fn: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"hocc.{fn} was called before the default process group exists; call "
                           "torch.distributed.init_process_group(...) first")


def resolve_group(group: dist.ProcessGroup | None, fn: str) -> dist.ProcessGroup:
    world = dist.group.WORLD if dist.is_available() else None
    if world is None:
        check_initialized(fn)  # raises: no default group
    if world is not None and (group is None or group is world):  # every rank is the world's: no lookups
        return world
    g = group
    if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
        raise HoccError(f"hocc.{fn}: this rank is not a member of the given group; call collectives "
                        "only on ranks that belong to the group")
    if dist.get_rank(g) < 0:
        raise HoccError(f"hocc.{fn}: this rank is not a member of the given group")
    return g


def check_algo(algo: str, fn: str) -> str:
    if algo == "auto":  # the default: always a choice
        return algo
    if algo not in algo_choices():
        raise HoccError(f"hocc.{fn}: unknown algo {algo!r}; use one of {', '.join(algo_choices())}")
    return algo


def check_op(op: object, fn: str) -> str:
    try:
        name = op_name(op)
    except ValueError as e:
        raise HoccError(f"hocc.{fn}: {e}") from None
    return name  # any dtype: AVG of integers is the integer sum, divided toward zero (as NCCL's)


def check_tensor(t: object, what: str, fn: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise HoccError(f"hocc.{fn}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPE_SET:
        names = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise HoccError(f"hocc.{fn}: {what} has dtype {t.dtype}, which hocc does not support; use one of {names}")
    if not t.is_contiguous():
        raise HoccError(f"hocc.{fn}: {what} is not contiguous; pass {what}.contiguous() "
                        "(and copy the result back if you need it in the original tensor)")
    if t.is_sparse:
        raise HoccError(f"hocc.{fn}: {what} is sparse; hocc takes dense tensors")
    if not (t.is_cpu or t.is_cuda):
        raise HoccError(f"hocc.{fn}: {what} is on {t.device}; hocc runs on cpu (gloo) and cuda (nccl) tensors")
    return t


def check_same(tensors: Sequence[torch.Tensor], names: Sequence[str], fn: str) -> None:
    first, first_name = tensors[0], names[0]
    for t, name in zip(tensors[1:], names[1:], strict=True):
        if t.device != first.device:
            raise HoccError(f"hocc.{fn}: {name} is on {t.device} but {first_name} is on {first.device}; "
                            "put all tensors of one call on the same device")
        if t.dtype != first.dtype:
            raise HoccError(f"hocc.{fn}: {name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
                            "use one dtype for all tensors of one call")


def check_sizes(out: torch.Tensor, want: int, what: str, fn: str) -> None:
    if out.numel() != want:
        raise HoccError(f"hocc.{fn}: {what} has {out.numel()} elements but this call needs {want}; "
                        f"allocate {what} with {want} elements")
