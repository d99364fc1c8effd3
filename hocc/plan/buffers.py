"""Which buffers a plan's steps read and write (hocc.plan.types, "Buffers"):
decided once when the plan is built, so that skipping a copy is plan data,
not a special case in an executor.

- all_reduce / reduce_scatter whose layout is the identity (no padding, no
  reordering): stage 0 reads the caller's input directly, so nothing is
  packed. Results still go to the private work buffer, so a failed call
  leaves the caller's tensors as they were (an all_reduce's output is its
  input). On CPU the executor runs an unpadded all_reduce of this kind in
  the caller's output itself, saving each chunk before its first write and
  putting it back on failure (csrc/executor/executor.cc, Journal): the same
  guarantee, without a copy of the whole result after the last step.
- all_gather whose layout is the identity: the work buffer is the caller's
  output; only this rank's own block is packed into it and nothing is
  unpacked. A failure may leave the output part-written; the input is only
  read.
- native plans are one step from the caller's input to its output
  (hocc.plan.native).
"""

from __future__ import annotations

from dataclasses import replace

from hocc.plan.types import Layout, Plan


def is_identity(collective: str, lay: Layout, in_order: bool | None = None) -> bool:
    """True when the work buffer holds the caller's buffer element for element.
    `in_order`: whether the layout's blocks are in rank order, when known (a
    size-generic plan knows it once for every size)."""
    unpadded = lay.chunks * lay.piece == lay.block_elems
    if collective == "all_reduce":
        return unpadded
    if not unpadded or lay.chunks != 1:
        return False
    return in_order if in_order is not None else lay.order == tuple(range(lay.blocks))


def stage0_reads_everything(plan: Plan) -> bool:
    """True when, for every chunk, each rank's stage-0 steps read the chunk's
    whole region: then nothing else needs the packed input."""
    lay = plan.layout
    span = lay.blocks * lay.piece
    covered: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in plan.steps:
        if s.stage == 0:
            for g in s.groups:
                for r in g.ranks:
                    covered.setdefault((r, s.chunk), []).append(s.region(g))
    for r in range(plan.world):
        for k in range(lay.chunks):
            end = k * span
            for lo, hi in sorted(covered.get((r, k), [])):
                if lo > end:
                    return False
                end = max(end, hi)
            if end < (k + 1) * span:
                return False
    return True


def route_buffers(plan: Plan) -> Plan:
    """The plan with its buffers chosen (see the module docstring)."""
    return route_as(plan, is_identity(plan.collective, plan.layout))


def route_as(plan: Plan, identity: bool) -> Plan:
    """The plan routed as one whose layout is the identity or not: what
    route_buffers does, for a size-generic plan whose sizes may be either
    (hocc.plan.shapes; stage 0's coverage does not depend on the size)."""
    if plan.work_at == "none" or not identity:  # no work buffer (native): nothing to route
        return plan
    if plan.collective == "all_gather":
        return replace(plan, work_at="output")
    if not stage0_reads_everything(plan):
        return plan
    steps = tuple(replace(s, src="input") if s.stage == 0 else s for s in plan.steps)
    return replace(plan, steps=steps, pack=False)
