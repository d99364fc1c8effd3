"""Carries out a plan on one rank's work buffer. Decides nothing.

Steps run as a wavefront: at tick t, stage s of chunk t-s is launched once
stage s-1 of that chunk has ended; all launches are asynchronous, so every
stage of the pipeline (and every group of a step) is in flight at once.
Native steps are the backend's async collectives on cached sub-groups (for
NCCL, waiting makes the current stream wait, so the CPU never blocks); ring
steps run point-to-point on a helper thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hocc.engine.reduce import wire_op
from hocc.engine.ring_p2p import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from hocc.engine.subgroups import SubgroupCache
from hocc.plan.types import GroupSlice, Plan, Step


def stage_tag(step: Step) -> str:
    """Sub-groups are per stage, so one stage's queue never holds up another's."""
    return f"s{step.stage}"


class Handle(Protocol):
    def wait(self) -> None: ...


class _NativeHandle:
    def __init__(self, work: Any, finalize: Callable[[], None] | None = None) -> None:
        self.work, self.finalize = work, finalize

    def wait(self) -> None:
        self.work.wait()
        if self.finalize is not None:
            self.finalize()
            self.finalize = None


class _ThreadHandle:
    def __init__(self, fut: Future[None]) -> None:
        self.fut = fut

    def wait(self) -> None:
        self.fut.result()


class _AllHandle:
    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles

    def wait(self) -> None:
        for h in self.handles:
            h.wait()


def reads_caller_input(plan: Plan, count: int) -> bool:
    """True when the plan can read the caller's input in place of a packed
    work buffer: one all-reduce step through shared memory over the whole,
    unpadded tensor (a single host's all_reduce). It saves a full copy; the
    results still land in the work buffer, so a failure leaves the caller's
    tensor as it was."""
    return (plan.collective == "all_reduce" and plan.layout.size == count and len(plan.steps) == 1
            and plan.steps[0].impl == "shm" and plan.steps[0].op == "all_reduce"
            and all(g.offset == 0 and g.seg == count for g in plan.steps[0].groups))


class Executor:
    def __init__(self, subgroups: SubgroupCache, trace: bool = False) -> None:
        self.subgroups = subgroups
        # trace: run steps one at a time and record (stage, chunk, op, tier, seconds);
        # for measuring stage times, not for speed
        self.trace = trace
        self.timings: list[tuple[int, int, str, str, float]] = []
        self.rank = subgroups.rank
        self._threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hocc-ring")

    def prepare(self, plan: Plan) -> None:
        """Create the sub-groups the plan needs (collective over their members)."""
        self.subgroups.ensure([(stage_tag(s), g.ranks) for s in plan.steps for g in s.groups
                               if len(g.ranks) > 1 and s.impl != "shm"])

    def run(self, plan: Plan, work: torch.Tensor, op: str, source: torch.Tensor | None = None) -> None:
        """source: the caller's input where it can stand in for the packed work
        buffer (see reads_caller_input): stage 0 reads it, and writes `work`."""
        mine = {(s.stage, s.chunk): s for s in plan.steps}
        pending: dict[tuple[int, int], Handle] = {}
        try:
            for t in range(plan.chunks + plan.stages - 1):
                for s in range(plan.stages):
                    k = t - s
                    if not 0 <= k < plan.chunks:
                        continue
                    step = mine.get((s, k))
                    groups = [g for g in step.groups_of(self.rank) if len(g.ranks) > 1] if step else []
                    if step is not None and groups:
                        # this rank's nearest earlier stage of the chunk (it may have none at s-1)
                        for p in range(s - 1, -1, -1):
                            if (p, k) in pending:
                                pending.pop((p, k)).wait()
                                break
                        start = time.perf_counter()
                        pending[(s, k)] = self._launch_all(step, groups, work, op, source if s == 0 else None)
                        if self.trace:
                            pending.pop((s, k)).wait()
                            self.timings.append((s, k, step.op, step.tier, time.perf_counter() - start))
            for key in sorted(pending):
                pending.pop(key).wait()
        finally:
            for h in pending.values():  # after an error: let in-flight ops end before the buffer is freed
                with contextlib.suppress(Exception):  # the first error is the one raised
                    h.wait()

    def _launch_all(self, step: Step, groups: list[GroupSlice], work: torch.Tensor, op: str,
                    source: torch.Tensor | None) -> Handle:
        """A rank's groups of one step (several on unequal hosts, plan/types.py), in
        the listed order: ring groups one after another on one thread, native ones
        issued in order on their own sub-groups."""
        if len(groups) == 1:
            return self._launch(step, groups[0], work, op, source)
        if step.impl == "shm":
            raise ValueError(f"plan puts rank {self.rank} in several shared-memory groups of one step")
        if step.impl == "ring":
            pgs = [self.subgroups.get(stage_tag(step), g.ranks) for g in groups]

            def rings() -> None:
                for g, pg in zip(groups, pgs, strict=True):
                    self._ring(step, g, pg, work, op, g.ranks.index(self.rank), len(g.ranks))

            return _ThreadHandle(self._threads.submit(rings))
        return _AllHandle([self._launch(step, g, work, op, source) for g in groups])

    def _launch(self, step: Step, g: GroupSlice, work: torch.Tensor, op: str,
                source: torch.Tensor | None = None) -> Handle:
        me, n = g.ranks.index(self.rank), len(g.ranks)
        if step.impl == "shm":
            shm = self.subgroups.shm(stage_tag(step), g.ranks)
            return _ThreadHandle(shm.submit(step.op, work, g.offset, g.seg, op, source))
        pg = self.subgroups.get(stage_tag(step), g.ranks)
        if step.impl == "ring":
            return _ThreadHandle(self._threads.submit(self._ring, step, g, pg, work, op, me, n))
        if step.op == "all_reduce":
            region = work[g.offset:g.offset + g.seg]
            opts = dist.AllreduceOptions()
            opts.reduceOp = wire_op(op)
            return _NativeHandle(pg.allreduce([region], opts))
        region = work[g.offset:g.offset + n * g.seg]
        mine = work[g.offset + me * g.seg:g.offset + (me + 1) * g.seg]
        if step.op == "reduce_scatter":
            out = torch.empty_like(mine)  # the backend must not read and write the same memory
            ropts = dist.ReduceScatterOptions()
            ropts.reduceOp = wire_op(op)
            return _NativeHandle(pg._reduce_scatter_base(out, region, ropts), lambda: mine.copy_(out))
        if step.op == "all_gather":
            return _NativeHandle(pg._allgather_base(region, mine.clone()))
        raise ValueError(f"unknown plan op {step.op!r}")

    @staticmethod
    def _ring(step: Step, g: GroupSlice, pg: dist.ProcessGroup, work: torch.Tensor, op: str,
              me: int, n: int) -> None:
        tag = step.chunk
        if step.op == "all_reduce":
            ring_all_reduce(pg, work[g.offset:g.offset + g.seg], me, n, op, tag)
            return
        segs = [work[g.offset + i * g.seg:g.offset + (i + 1) * g.seg] for i in range(n)]
        if step.op == "reduce_scatter":
            ring_reduce_scatter(pg, segs, me, op, tag)
        else:
            ring_all_gather(pg, segs, me, tag)

    def close(self) -> None:
        self._threads.shutdown(wait=False)
        self.subgroups.close()
