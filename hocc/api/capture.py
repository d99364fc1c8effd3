"""CUDA graphs: a hocc collective cannot be captured, and says so.

NCCL's own calls are capturable (torch's ProcessGroupNCCL, which hocc's steps
run on, supports it), but a hocc call is more than its NCCL calls: a first
call of a size may plan, create communicators (store round trips, NCCL
init), and take a work buffer from Python, none of which a replayed graph
would repeat, and the engine's worker may run the call on another thread.
So a call on a capturing stream raises here, before anything is enqueued
(the capture is left intact), with what to do instead."""

from __future__ import annotations

import torch

from hocc.api.validate import HoccError


def check_not_capturing(tensor: torch.Tensor, fn: str) -> None:
    if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
        raise HoccError(f"hocc.{fn}: the current CUDA stream is being captured into a CUDA graph, and hocc "
                        "collectives cannot be captured (a first call may plan and create communicators, which "
                        "a replay would not repeat); call it outside torch.cuda.graph(), or capture "
                        "torch.distributed's own collective on an NCCL group (ProcessGroupNCCL supports capture)")
