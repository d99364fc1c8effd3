"""The C++ executor over NCCL for one engine (process group, CUDA device): the
communicator is made once from a unique id passed through the group's store;
each plan's sub-communicators are split on first use; runs are enqueued on the
caller's current stream (no host thread blocks, no Python in the loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hocc.executor import require_cuda

if TYPE_CHECKING:
    from hocc.engine.engine import GroupInfo


class NcclRunner:
    def __init__(self, info: GroupInfo, device: torch.device, prefix: str) -> None:
        c = require_cuda()
        key = f"{prefix}/nccl-id"
        if info.rank == 0:
            info.store.set(key, c.NcclTransport.unique_id())
        uid = info.store.get(key)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.transport = c.NcclTransport(uid, info.rank, info.size, index)
        self.executor = c.Executor(self.transport)
        self.device = device

    def stream(self) -> int:
        """The caller's current stream, which the run is ordered on."""
        return int(torch.cuda.current_stream(self.device).cuda_stream)
