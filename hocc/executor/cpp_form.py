"""A Python plan (hocc.plan.types) in the C++ executor's form. Plans are
immutable; the engine caches the converted form beside the plan."""

from __future__ import annotations

from typing import Any

from hocc.executor import load
from hocc.plan.types import Plan


def to_cpp(plan: Plan) -> Any:
    lay = plan.layout
    steps = [(s.stage, s.chunk, s.collective, s.impl, s.src, s.dst,
              [(list(g.ranks), g.offset, g.seg) for g in s.groups]) for s in plan.steps]
    layout = (lay.blocks, lay.block_elems, lay.chunks, lay.piece, list(lay.order))
    return load().Plan(plan.collective, plan.world, plan.stages, layout, plan.work_at, plan.pack, steps)


def dtype_name(t: Any) -> str:
    """'float32', 'bfloat16', ... as the executor names a torch dtype."""
    return str(t).removeprefix("torch.")
