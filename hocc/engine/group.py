"""What an engine knows of its process group before any call: who is in it,
the store to meet on, the backend that runs its whole-group collectives, its
timeout and its topology (bootstrapped through the store), and the backends
hocc makes for its sub-groups: gloo for CPU tensors, NCCL for CUDA ones,
both torch's own classes."""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import Config
from hocc.engine.errors import CollectiveError
from hocc.plan.nccl_defaults import NCCL_LINKS
from hocc.topology import Topology, from_hostnames, parse_spec
from hocc.topology.detect import from_host_reports, host_report

log = logging.getLogger("hocc")


@dataclass(frozen=True)
class GroupInfo:
    """What an engine needs of its process group: who is in it, the store to
    meet on, and the backend that runs its native collectives (gloo or NCCL)."""

    rank: int
    size: int
    global_ranks: list[int]
    name: str
    store: dist.Store
    inner: Any
    timeout: timedelta

    @staticmethod
    def of(group: dist.ProcessGroup, device: torch.device) -> GroupInfo:
        return GroupInfo(dist.get_rank(group), dist.get_world_size(group), dist.get_process_group_ranks(group),
                         str(group.group_name), dist.distributed_c10d._get_default_store(),
                         group._get_backend(device), group_timeout(group, device))


def group_timeout(group: dist.ProcessGroup, device: torch.device) -> timedelta:
    """The group's timeout, which hocc's sub-groups and shared memory inherit."""
    try:
        t = group._get_backend(device).options._timeout
        if isinstance(t, timedelta):
            return t
    except (AttributeError, RuntimeError):
        pass
    return dist.default_pg_timeout


def device_name(device: torch.device) -> str:
    """'cpu' or 'cuda:N' (the index made explicit: the C++ side and NCCL need it)."""
    if device.type != "cuda":
        return device.type
    return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"


def backend_class(device: torch.device) -> Any:
    """torch's backend for `device`'s tensors: ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA."""
    if device.type == "cpu":
        return dist.ProcessGroupGloo
    if device.type == "cuda":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("hocc: CUDA tensors need torch's NCCL backend, which this torch build lacks")
        return nccl
    raise RuntimeError(f"hocc: {device.type} tensors are not supported; use cpu or cuda tensors")


def new_backend(device: torch.device, store: dist.Store, rank: int, size: int, timeout: timedelta) -> Any:
    """A backend of torch's for `size` ranks meeting on `store` (only they take
    part, nothing global is counted). torch's NCCL backend brings its own
    watchdog, deadlines, abort, blocking wait and flight recorder with it."""
    cls = backend_class(device)
    if device.type == "cpu":
        return cls(store, rank, size, timeout)
    opts = cls.Options()
    opts._timeout = timeout
    return cls(store, rank, size, opts)


def resolve_topology(info: GroupInfo, prefix: str, cfg: Config, device: torch.device | None = None) -> Topology:
    """The group's topology, renumbered by group rank: from the HOCC_TOPOLOGY
    spec (which describes the world) if set, else from what each rank sees of
    its host, exchanged through the store (no collective, so it works inside
    a backend): its hostname, and on CUDA its GPUs, NVLink and NICs
    (hocc.topology.detect; what cannot be seen falls back to hostnames)."""
    if cfg.topology:
        world = parse_spec(cfg.topology)
        # while the hocc backend builds the default group, that group is the world
        job = dist.get_world_size() if dist.is_initialized() else info.size
        if world.world_size != job:
            raise ValueError(f"HOCC_TOPOLOGY={cfg.topology!r} describes {world.world_size} ranks but the world "
                             f"has {job}; give a spec with that many ranks")
        return world.restrict(info.global_ranks)
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        info.store.set(f"{prefix}/host/{info.rank}", json.dumps(host_report(index)))
        reps = [json.loads(v) for v in gather_from_store(info, f"{prefix}/host", "its host report")]
        return from_host_reports([r["hostname"] for r in reps], reps, NCCL_LINKS,
                                 warn=log.warning if info.rank == 0 else (lambda _: None))
    info.store.set(f"{prefix}/host/{info.rank}", socket.gethostname())
    names = [v.decode() for v in gather_from_store(info, f"{prefix}/host", "its hostname")]
    return from_hostnames(names)


def gather_from_store(info: GroupInfo, key: str, what: str) -> list[bytes]:
    """Every rank's `key/<rank>` from the store. A rank that never writes its
    key (it made another call, or is gone) fails the wait with the store's
    timeout; that becomes a CollectiveError naming the ranks that never came,
    instead of the store's raw error with its internal key."""
    keys = [f"{key}/{r}" for r in range(info.size)]
    try:
        # bounded by the group's timeout, not the store's own (a store the caller made, a FileStore say,
        # keeps its default of minutes: a rank that never came hung its peers that long, or forever)
        info.store.wait(keys, info.timeout)
        return [info.store.get(k) for k in keys]
    except (dist.DistStoreError, RuntimeError) as e:
        missing = [r for r in range(info.size) if not _has_key(info.store, f"{key}/{r}")]
        glob = [info.global_ranks[r] for r in missing]
        raise CollectiveError(
            f"hocc: setting up group {info.name!r} (rank {info.rank} of {info.size}) timed out after "
            f"{info.timeout}: rank(s) {missing} (global {glob}) never sent {what}. They made another call than "
            "this rank's first hocc collective on the group, or are gone; every rank must make the same "
            f"collectives in the same order. The store said: {e}", group=info.name) from e


def _has_key(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except RuntimeError:
        return False
