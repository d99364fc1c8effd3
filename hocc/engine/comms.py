"""The communicators an engine's plans need, set up once each and handed
to the C++ executor's GroupTransport (csrc/transport/group.h):

- 'native' and 'ring' steps: a backend of torch's per (stage, members),
  ProcessGroupGloo for CPU tensors and ProcessGroupNCCL for CUDA ones
  (hocc.engine.group.new_backend), built on the parent's store under a prefix
  unique to the parent group and this engine generation (only the members
  take part, and no global group counter has to agree across ranks); the
  executor calls it from C++ (csrc/transport/c10d.cc). A native step over the
  whole group uses the group's own backend.
- 'shm' steps (CPU only): a shared-memory segment per host group (hocc/engine/shm.py).
- on CPU, 'native' and 'ring' steps go over UCX instead (hocc/engine/ucx.py,
  csrc/transport/ucx.h) when net_transport allows and every member of the
  communicator has it; its native collectives are rings over its exchange.
  `kinds` says which carried a communicator ('shm', 'ucx', 'gloo', 'nccl').

Setting up is collective over each group's members, so every rank walks the
same sorted list of (stage, members, impl): ranks that share two groups never
wait on each other in opposite orders. Sub-groups are per stage, so one
stage's traffic never queues behind another's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hocc.engine.group import GroupInfo, backend_class, device_name, new_backend
from hocc.engine.shm import attach_shm
from hocc.engine.ucx import attach_ucx
from hocc.executor import load
from hocc.plan.types import Plan


class Kinds(dict[tuple[int, tuple[int, ...], str], str]):
    """What carried each communicator this rank set up, by (stage, members, impl); called as
    kinds(stage, members, impl) -> 'shm', 'ucx', 'gloo', 'nccl' ('' if none). A dict of its own, so
    the flight recorder can keep it without keeping the communicators' groups alive."""

    def __call__(self, stage: int, members: tuple[int, ...] | list[int], impl: str) -> str:
        return self.get((stage, tuple(members), impl), "")


class Communicators:
    def __init__(self, info: GroupInfo, prefix: str, transport: Any, device: torch.device, shm_piece_bytes: int,
                 shm_wait: str, net_transport: str = "auto", ucx_spin_us: int = 50, tcp_buffer: int = 0) -> None:
        self.info, self.prefix, self.transport, self.device = info, prefix, transport, device
        self.shm_piece_bytes, self.shm_wait = shm_piece_bytes, shm_wait
        self.net_transport = net_transport if device.type == "cpu" else "gloo"  # NCCL on GPUs, always
        self.ucx_spin_us, self.tcp_buffer = ucx_spin_us, tcp_buffer
        self.rank = info.rank
        self._pgs: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.kinds = Kinds()

    def prepare(self, plan: Plan) -> None:
        """Set up every communicator of `plan` this rank takes part in and does not have yet."""
        wanted = sorted({(s.stage, g.ranks, s.impl) for s in plan.steps for g in s.groups
                         if len(g.ranks) > 1 and self.rank in g.ranks})
        c = load()
        for stage, members, impl in wanted:
            if self.transport.has(stage, list(members), impl):
                continue
            me, n = members.index(self.rank), len(members)
            own = backend_class(self.device)
            if impl != "shm" and not self._whole_group(stage, members, impl) and not isinstance(self.info.inner, own):
                raise RuntimeError(f"hocc runs {self.device.type} plans over {own.__name__} sub-groups, not "
                                   f"{type(self.info.inner).__name__}; use {own.__name__} under it for "
                                   f"{self.device.type} tensors, or algo='native'")
            try:
                kind = "shm" if impl == "shm" else "nccl" if self.device.type == "cuda" else "gloo"
                comm = None
                if impl == "shm":
                    comm = attach_shm(self.info.store, self._name(stage, members, "shm"), me, n,
                                      self.info.timeout, self.shm_piece_bytes, self.shm_wait)
                elif self.net_transport != "gloo":
                    comm = attach_ucx(self.info.store, self._name(stage, members, f"ucx-{impl}"), me, n,
                                      self.info.timeout, self.net_transport, self.ucx_spin_us, self.tcp_buffer)
                    kind = "ucx" if comm is not None else kind
                if comm is None:
                    comm = c.c10d_comm(self._backend(stage, members, impl), me, n, device_name(self.device))
            except Exception as e:  # re-raised with what was being set up
                raise RuntimeError(
                    f"setting up the {impl} communicator of stage {stage} over ranks "
                    f"[{','.join(map(str, members))}] failed: {e} (every "
                    "member sets it up at its first call that needs it: a member that is gone, stopped, or in "
                    "another call, such as the same call with another algo or size, never arrives)") from e
            self.transport.add(stage, list(members), impl, comm)
            self.kinds[(stage, members, impl)] = kind

    def _whole_group(self, stage: int, members: tuple[int, ...], impl: str) -> bool:
        """The whole group's own collective, run on its own backend. Ring steps never use it, so their
        point-to-point messages cannot meet the caller's own send/recv on that backend."""
        return impl == "native" and members == tuple(range(self.info.size)) and stage == 0

    def _backend(self, stage: int, members: tuple[int, ...], impl: str) -> Any:
        if self._whole_group(stage, members, impl):
            return self.info.inner
        key = (stage, members)
        if key not in self._pgs:
            self._pgs[key] = self._create(stage, members)
        return self._pgs[key]

    def _name(self, stage: int, members: tuple[int, ...], kind: str) -> str:
        return f"{self.prefix}/s{stage}/{kind}/{'-'.join(map(str, members))}"

    def _create(self, stage: int, members: tuple[int, ...]) -> Any:
        kind = "gloo" if self.device.type == "cpu" else self.device.type
        store = dist.PrefixStore(self._name(stage, members, kind), self.info.store)
        return new_backend(self.device, store, members.index(self.rank), len(members), self.info.timeout)

    def abort(self, why: str) -> None:
        """Wake whatever is blocked on these communicators: the C++ side's abort
        (the shared-memory segments' flag, so host peers fail too; the c10d
        comms' point-to-point waits), then the backend's own abort of each
        sub-group (gloo's; NCCL's ncclCommAbort)."""
        self.transport.abort(why)
        for pg in list(self._pgs.values()):
            pg.abort()

    def close(self) -> None:
        """Drop every communicator: the C++ side's references first (the
        segments are unmapped with the last one), then the sub-groups, shut
        down so their threads and sockets go now rather than whenever the
        last reference dies. The whole group's own backend is not ours to shut."""
        self.transport.clear()
        pgs, self._pgs = list(self._pgs.values()), {}
        for pg in pgs:
            pg.shutdown()
