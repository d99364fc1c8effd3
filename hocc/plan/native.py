"""`native`: the backend's own collective over the whole group (the baseline),
as a one-step plan from the caller's input straight to its output: no work
buffer, no copies (hocc.plan.buffers).

Bytes on the wire are the backend's business (gloo and NCCL run rings in rank
order, so a placement that is not host by host crosses hosts at most steps).
"""

from __future__ import annotations

from hocc.plan.types import GroupSlice, Layout, Plan, Step


def build_native(collective: str, world: int, count: int, tier: str) -> Plan:
    blocks = 1 if collective == "all_reduce" else world
    layout = Layout.identity(blocks, count)
    step = Step(0, 0, collective, "native", tier, (GroupSlice(tuple(range(world)), 0, count),),
                src="input", dst="output")
    return Plan(collective, "native", world, count, layout, (step,), stages=1, work_at="none", pack=False)
