"""One engine per (process group, device type): the group's topology, its
cached sub-groups and plans, and a single worker that runs calls in the order
they were made (every rank issues the same collectives in the same order,
which is what keeps sub-group traffic matched across ranks)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import Config
from hocc.engine.executor import Executor
from hocc.engine.subgroups import SubgroupCache, group_timeout
from hocc.engine.work import Work
from hocc.native import available as native_available
from hocc.native import cuda_built
from hocc.native.nccl import NcclRunner
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.types import Plan
from hocc.topology import Topology, from_hostnames, parse_spec

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


def resolve_topology(info: GroupInfo, prefix: str, cfg: Config) -> Topology:
    """The group's topology, renumbered by group rank: from the HOCC_TOPOLOGY
    spec (which describes the world) if set, else from the ranks' hostnames,
    exchanged through the store (no collective, so it works inside a backend)."""
    if cfg.topology:
        world = parse_spec(cfg.topology)
        # while the hocc backend builds the default group, that group is the world
        job = dist.get_world_size() if dist.is_initialized() else info.size
        if world.world_size != job:
            raise ValueError(f"HOCC_TOPOLOGY={cfg.topology!r} describes {world.world_size} ranks but the world "
                             f"has {job}; give a spec with that many ranks")
        return world.restrict(info.global_ranks)
    info.store.set(f"{prefix}/host/{info.rank}", socket.gethostname())
    names = [info.store.get(f"{prefix}/host/{r}").decode() for r in range(info.size)]
    return from_hostnames(names)


# Engines this process made per group and device: part of the store prefix, so
# a rebuilt engine never meets its predecessor's keys. Counted per group (not
# globally) because ranks use different sets of groups.
_generations: Counter[str] = Counter()


class Engine:
    def __init__(self, info: GroupInfo, device: torch.device, cfg: Config) -> None:
        self.info = info
        self.device = device
        self.cfg = cfg
        self.rank = info.rank
        self.size = info.size
        key = f"{info.name}/{device.type}"
        prefix = f"hocc/{key}/{_generations[key]}"
        _generations[key] += 1
        self.topology = resolve_topology(info, prefix, cfg)
        self.subgroups = SubgroupCache(info, prefix, cfg.shm_piece_bytes, cfg.shm_wait)
        self.executor = Executor(self.subgroups, trace=cfg.trace)
        self.native: NcclRunner | None = None  # the C++ executor, for CUDA tensors
        if device.type == "cuda" and (cfg.engine == "native" or (cfg.engine == "auto" and cuda_built())):
            self.native = NcclRunner(info, device, prefix)
        self.group: dist.ProcessGroup | None = None  # the API's group, when it made this engine
        self.last_plan: Plan | None = None
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hocc-engine")
        self._lock = threading.Lock()
        self._outstanding = 0
        self._spare: torch.Tensor | None = None  # a CPU work buffer kept between calls

    def planner_config(self, cfg: Config) -> PlannerConfig:
        ring_ops = cfg.ring_ops
        if ring_ops is None:  # gloo's reduce-scatter / all-gather lose to a p2p ring (bench/results)
            ring_ops = ("reduce_scatter", "all_gather") if self.device.type == "cpu" else ()
        shm = cfg.host_transport == "shm" or (cfg.host_transport == "auto" and native_available())
        cpu = self.device.type == "cpu"
        host_impl = "shm" if cpu and shm else ""
        # gloo between hosts: chunks of at most 0.1 s of NIC time keep shaped TCP links full
        # (planner.PlannerConfig.max_chunk_bytes); on fast links the rule never binds
        max_chunk = cfg.planner.max_chunk_bytes
        if max_chunk is None and cpu and len(self.topology.host_groups()) > 1:
            max_chunk = int(self.topology.links.nic.bandwidth * 0.1)
        return replace(cfg.planner, ring_ops=ring_ops, host_impl=host_impl, max_chunk_bytes=max_chunk)

    def plan(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config) -> Plan:
        pcfg = self.planner_config(cfg)
        key = (collective, count, elem_size, algo, pcfg)
        plan = self._plans.get(key)
        if plan is None:
            plan = make_plan(collective, count, elem_size, self.topology, algo, pcfg)
            if len(self._plans) > 4096:
                self._plans.clear()
            self._plans[key] = plan
        if cfg.debug:
            log.warning("hocc rank %d/%d (%s): %s", self.rank, self.size, self.topology.shape(), plan.summary())
        self.last_plan = plan
        return plan

    def take_work(self, nbytes: int) -> torch.Tensor | None:
        """A byte buffer for a work buffer, reused between calls on CPU: a fresh
        large allocation costs a page fault per 4 KiB (torch's CPU allocator
        returns big blocks to the OS), which at 8 ranks on 2 cores costs more
        than the copies. None: let the caller allocate (CUDA has its own cache)."""
        if self.device.type != "cpu":
            return None
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None or spare.numel() < nbytes:
            spare = torch.empty(nbytes, dtype=torch.uint8)
        return spare

    def give_back_work(self, buf: torch.Tensor | None) -> None:
        """Return a buffer from take_work (only after the run ended well: a failed
        run's buffer may still be written by an op that is stuck)."""
        if buf is not None:
            with self._lock:
                if self._spare is None or self._spare.numel() < buf.numel():
                    self._spare = buf

    def run_plan(self, plan: Plan, work: torch.Tensor, op_name: str, source: torch.Tensor | None = None) -> None:
        """Carry out a (non-native) plan on this rank's work buffer (`source`: see
        executor.reads_caller_input)."""
        if self.native is not None:
            self.native.run(plan, work, op_name)
            return
        self.executor.prepare(plan)
        self.executor.run(plan, work, op_name, source)
        if self.executor.trace:
            self.log_trace(plan)

    def log_trace(self, plan: Plan) -> None:
        """Per-stage seconds of the plan just run (HOCC_TRACE=1), summed over chunks."""
        per: dict[tuple[int, str, str], float] = {}
        for stage, _, op, tier, secs in self.executor.timings:
            per[(stage, op, tier)] = per.get((stage, op, tier), 0.0) + secs
        self.executor.timings.clear()
        parts = ", ".join(f"s{s} {op}@{tier} {t * 1e3:.1f} ms" for (s, op, tier), t in sorted(per.items()))
        log.warning("hocc trace rank %d: %s: %s", self.rank, plan.summary(), parts)

    def submit(self, job: Callable[[], None], result: list[torch.Tensor], async_op: bool) -> Work | None:
        """Run `job` after every earlier call of this engine; block unless async_op."""
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        with self._lock:
            inline = not async_op and self._outstanding == 0
            if not inline:
                self._outstanding += 1
        if inline:
            with self._on_stream(stream):
                job()
            return None
        fut: Future[None] = self._worker.submit(self._run_job, job, stream)
        work = Work(fut, result)
        if async_op:
            return work
        work.wait()
        return None

    def _run_job(self, job: Callable[[], None], stream: Any) -> None:
        try:
            with self._on_stream(stream):
                job()
        finally:
            with self._lock:
                self._outstanding -= 1

    @contextlib.contextmanager
    def _on_stream(self, stream: Any) -> Iterator[None]:
        if stream is None:
            yield
        else:
            with torch.cuda.stream(stream):
                yield

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.executor.close()


_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def get_engine(group: dist.ProcessGroup, device: torch.device, cfg: Config) -> Engine:
    own = getattr(group, "hocc_engine", None)
    if own is not None:  # a group of the hocc backend keeps its own engines
        return own(device)  # type: ignore[no-any-return]
    key = (id(group), device.type)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is not None and eng.group is group and eng.cfg.topology == cfg.topology:
            return eng
    eng = Engine(GroupInfo.of(group, device), device, cfg)
    eng.group = group
    with _engines_lock:
        old = _engines.get(key)
        _engines[key] = eng
    if old is not None:
        old.close()
    return eng


def reset_engines() -> None:
    """Forget every engine (after destroy_process_group, or to apply new settings)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for e in engines:
        e.close()
