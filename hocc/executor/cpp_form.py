"""A Python plan (hocc.plan.types) in the C++ executor's form, read from its JSON. Plans are
immutable; the engine caches the converted form beside the plan."""

from __future__ import annotations

from typing import Any

from hocc.executor import load
from hocc.plan.types import Plan


def to_cpp(plan: Plan) -> Any:
    """The plan's one wire format into C++ is its JSON (csrc/core/plan.cc, plan_from_json), the same text
    the sanitizer's planner-written fixtures hold (tests/fixtures/plans/)."""
    return load().Plan(plan.to_json(indent=None))


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(t: Any) -> str:
    """'float32', 'bfloat16', ... as the executor names a torch dtype (kept: every call asks)."""
    name = _DTYPE_NAMES.get(t)
    if name is None:
        name = _DTYPE_NAMES[t] = str(t).removeprefix("torch.")
    return name
