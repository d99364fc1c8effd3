"""CUDA graphs: a hocc collective cannot be captured, and says so.

NCCL's own calls are capturable, but a hocc call is more than its NCCL calls:
the engine may create communicators on a first call (store round trips,
ncclCommSplit), CPU-side work buffers and the worker thread run outside the
stream, and the watchdog (csrc/transport/nccl_watchdog.h) watches every run
with events it polls from the host, which a replayed graph would never
record. So a call on a capturing stream raises here, before anything is
enqueued (the capture is left intact), with what to do instead; the C++
transport refuses it too (NcclWatchdog::begin), for callers that skip the API."""

from __future__ import annotations

import torch

from hocc.api.validate import HoccError


def check_not_capturing(tensor: torch.Tensor, fn: str) -> None:
    if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
        raise HoccError(f"hocc.{fn}: the current CUDA stream is being captured into a CUDA graph, and hocc "
                        "collectives cannot be captured (they poll their progress from the host and may create "
                        "communicators on a first call); call it outside torch.cuda.graph(), or capture "
                        "torch.distributed's own collective on an NCCL group (ProcessGroupNCCL supports capture)")
