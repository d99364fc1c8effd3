"""A Python plan (hocc.plan.types) in the C++ executor's form. The conversion
is cached on the plan object, as plans are cached and reused per call shape."""

from __future__ import annotations

from typing import Any

from hocc.native import load
from hocc.plan.types import Plan, one_group_per_rank


def to_native(plan: Plan) -> Any:
    cached = plan.__dict__.get("_native")
    if cached is not None:
        return cached
    plan = one_group_per_rank(plan)  # the C++ executor runs one group per rank per step (plan/types.py)
    steps = [(s.stage, s.chunk, s.op, s.impl, [(list(g.ranks), g.offset, g.seg) for g in s.groups])
             for s in plan.steps]
    native = load().Plan(plan.world, plan.stages, plan.chunks, plan.layout.size, steps)
    plan.__dict__["_native"] = native
    return native
