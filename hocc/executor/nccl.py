"""The C++ executor over NCCL for one engine (process group, CUDA device): the
communicator is made once from a unique id passed through the group's store;
each plan's sub-communicators are split on first use; runs are enqueued on the
caller's current stream (no host thread blocks, no Python in the loop).

Every run is watched (csrc/transport/nccl_watchdog.h): init, splits and runs
have the group's timeout; on a timeout or an NCCL async error the transport's
communicators are aborted, so the caller's stream drains instead of hanging,
and every later call raises, saying to destroy the group and init it again.
How it relates to torch's ProcessGroupNCCL (whose watchdog never sees hocc's
communicators):
  - TORCH_NCCL_ASYNC_ERROR_HANDLING (or HOCC_NCCL_ASYNC_ERROR_HANDLING) picks
    what an error does, with torch's values: 0 record it only, 1 abort and end
    the process, 2 abort the communicators only, 3 end the process. hocc's
    default is 2, not torch's 3: the process lives on, the next call raises,
    and the group can be re-initialised in the same process.
  - TORCH_NCCL_BLOCKING_WAIT=1 (or HOCC_NCCL_BLOCKING_WAIT=1) makes every call
    wait on the host until its run completed, raising on timeout or error; by
    default a call returns once enqueued, as torch's does.
  - hocc measures the timeout from when a run is enqueued, as torch does, but
    over the whole plan (all stages and chunks), and names the first step
    (stage, group) that did not finish.
  - Capture into a CUDA graph is refused with an error (ProcessGroupNCCL
    allows it): see hocc.api.dlpack.check_not_capturing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from hocc.executor import require_cuda

if TYPE_CHECKING:
    from hocc.engine.engine import GroupInfo

ON_ERROR_DEFAULT = 2  # abort the communicators, keep the process


def on_error_mode() -> int:
    """TORCH_NCCL_ASYNC_ERROR_HANDLING's value for hocc's watchdog (HOCC_ first)."""
    for name in ("HOCC_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        raw = os.environ.get(name, "").strip()
        if raw:
            if raw not in ("0", "1", "2", "3"):
                raise ValueError(f"{name}={raw!r}: use 0 (record only), 1 (abort and end the process), "
                                 "2 (abort the communicators) or 3 (end the process)")
            return int(raw)
    return ON_ERROR_DEFAULT


def blocking_wait() -> bool:
    for name in ("HOCC_NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"):
        raw = os.environ.get(name, "").strip().lower()
        if raw:
            return raw in ("1", "true", "yes", "on")
    return False


class WatchedExecutor:
    """The engine's executor on CUDA: Executor.run under the transport's watchdog."""

    def __init__(self, c: Any, transport: Any, blocking: bool) -> None:
        self._ex = c.Executor(transport)
        self._transport = transport
        self._blocking = blocking

    def run(self, plan: Any, input: int, output: int, work: int, dtype: str, op: str, stream: int = 0,
            call: Any = None, seq: int = -1) -> None:
        # `call` (the call id the CPU transports check at their first message) is not exchanged over
        # NCCL: a mismatched call there ends at the watchdog's deadline; HOCC_CHECK=1 catches it first
        self._transport.run(self._ex, plan, input, output, work, dtype, op, stream, seq)
        if self._blocking:
            self._transport.wait()

    def set_trace(self, on: bool) -> None:
        self._ex.set_trace(on)

    def set_record(self, keep: int) -> None:
        self._ex.set_record(keep)

    def records(self) -> list[Any]:
        return list(self._ex.records())

    def take_timings(self) -> list[tuple[int, int, str, float]]:
        return list(self._ex.take_timings())


class NcclRunner:
    def __init__(self, info: GroupInfo, device: torch.device, prefix: str) -> None:
        c = require_cuda()
        key = f"{prefix}/nccl-id"
        if info.rank == 0:
            info.store.set(key, c.NcclTransport.unique_id())
        uid = info.store.get(key)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.timeout_s = info.timeout.total_seconds()
        self.transport = c.NcclTransport(uid, info.rank, info.size, index, self.timeout_s, info.name,
                                         on_error_mode())
        self.executor = WatchedExecutor(c, self.transport, blocking_wait())
        self.device = device

    def stream(self) -> int:
        """The caller's current stream, which the run is ordered on."""
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def wait(self) -> None:
        """Block until every run so far completed (raises on timeout or an NCCL error)."""
        self.transport.wait()

    @property
    def error(self) -> str:
        """Why the watchdog aborted this group's communicators ('' while they work)."""
        return str(self.transport.error)
