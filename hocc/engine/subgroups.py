"""Sub-groups (host groups, rails, switch groups) as real torch.distributed
process groups, created once per (parent group, stage, members) and cached.

They are built directly on the parent's store, under a prefix unique to the
parent group and this engine generation, so that only their members take part
(a user's sub-group is called only by its members) and no global group counter
has to agree across ranks. Creation follows one global order (the sorted list
of all groups a plan needs), so ranks that share two groups never wait on
each other in opposite orders.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hocc.engine.shm import ShmGroup

if TYPE_CHECKING:
    from hocc.engine.engine import GroupInfo


class SubgroupCache:
    def __init__(self, info: GroupInfo, prefix: str, shm_piece_bytes: int, shm_wait: str) -> None:
        self.shm_piece_bytes, self.shm_wait = shm_piece_bytes, shm_wait
        self.timeout = info.timeout
        self.rank = info.rank
        self.backend = info.inner
        self.prefix = prefix
        self.store = info.store
        self._pgs: dict[tuple[str, tuple[int, ...]], dist.ProcessGroup] = {}
        self._shm: dict[tuple[str, tuple[int, ...]], ShmGroup] = {}

    def ensure(self, wanted: list[tuple[str, tuple[int, ...]]]) -> None:
        """Create every group in `wanted` (tag, members as group ranks) that
        contains this rank and does not exist yet, in one global order."""
        for tag, members in sorted(set(wanted)):
            if self.rank in members and (tag, members) not in self._pgs:
                self._pgs[(tag, members)] = self._create(tag, members)

    def get(self, tag: str, members: tuple[int, ...]) -> dist.ProcessGroup:
        return self._pgs[(tag, members)]

    def shm(self, tag: str, members: tuple[int, ...]) -> ShmGroup:
        """The shared-memory transport of a host group (its segment is mapped on first use)."""
        key = (tag, members)
        if key not in self._shm:
            name = "-".join(map(str, members))
            self._shm[key] = ShmGroup(self.store, f"{self.prefix}/{tag}/{name}", members, members.index(self.rank),
                                      self.timeout, self.shm_piece_bytes, self.shm_wait)
        return self._shm[key]

    def close(self) -> None:
        for g in self._shm.values():
            g.close()
        self._shm.clear()

    def _create(self, tag: str, members: tuple[int, ...]) -> dist.ProcessGroup:
        name = "-".join(map(str, members))
        store = dist.PrefixStore(f"{self.prefix}/{tag}/{name}", self.store)
        rank, size = members.index(self.rank), len(members)
        if isinstance(self.backend, dist.ProcessGroupGloo):
            return dist.ProcessGroupGloo(store, rank, size, self.timeout)
        nccl_cls = getattr(dist, "ProcessGroupNCCL", None)
        if nccl_cls is not None and isinstance(self.backend, nccl_cls):
            opts = nccl_cls.Options()
            opts._timeout = self.timeout
            return nccl_cls(store, rank, size, opts)
        raise RuntimeError(f"hocc cannot build sub-groups on backend {type(self.backend).__name__}; "
                           "use gloo (CPU) or nccl (CUDA) under it, or algo='native'")


def group_timeout(group: dist.ProcessGroup, device: torch.device) -> timedelta:
    """The parent group's timeout, which sub-groups inherit."""
    try:
        t = group._get_backend(device).options._timeout
        if isinstance(t, timedelta):
            return t
    except (AttributeError, RuntimeError):
        pass
    return dist.default_pg_timeout
