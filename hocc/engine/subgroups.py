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

from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist

# How many caches this process made per parent group: part of the store prefix,
# so a rebuilt engine never meets its predecessor's keys. Counted per group (not
# globally) because ranks use different sets of groups.
_generations: Counter[str] = Counter()


class SubgroupCache:
    def __init__(self, group: dist.ProcessGroup, device: torch.device, timeout: timedelta) -> None:
        self.parent = group
        self.device = device
        self.timeout = timeout
        self.global_ranks: list[int] = dist.get_process_group_ranks(group)
        self.rank: int = dist.get_rank(group)
        self.backend = group._get_backend(device)
        key = f"{group.group_name}/{device.type}"
        self.prefix = f"hocc/{key}/{_generations[key]}"
        _generations[key] += 1
        self.store = dist.distributed_c10d._get_default_store()
        self._pgs: dict[tuple[str, tuple[int, ...]], dist.ProcessGroup] = {}

    def ensure(self, wanted: list[tuple[str, tuple[int, ...]]]) -> None:
        """Create every group in `wanted` (tag, members as group ranks) that
        contains this rank and does not exist yet, in one global order."""
        for tag, members in sorted(set(wanted)):
            if self.rank in members and (tag, members) not in self._pgs:
                self._pgs[(tag, members)] = self._create(tag, members)

    def get(self, tag: str, members: tuple[int, ...]) -> dist.ProcessGroup:
        return self._pgs[(tag, members)]

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
