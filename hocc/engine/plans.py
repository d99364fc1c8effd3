"""An engine's plan cache: per (collective, count, element size, algo,
planner settings), the plan, its C++ form (which compiles this rank's part
once, at its first run: core/plan.h), its hash for the call check, and
whether its communicators exist yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hocc.engine.agreement import plan_hash
from hocc.executor.plans import to_native
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.types import Plan
from hocc.topology import Topology

# Plans kept per engine, least recently used dropped first. A plan and its C++
# form take about 10 KiB: a loop over many distinct sizes (the soak) would
# otherwise grow RSS by 10 KiB a call up to the cap, while a training loop uses
# a few dozen sizes.
PLAN_CACHE_SIZE = 256


@dataclass
class Compiled:
    """A cached plan, its C++ form, its hash (agreement.plan_hash), and whether its communicators exist."""

    plan: Plan
    native: Any
    hash: int
    prepared: bool = False


class PlanCache:
    def __init__(self, topology: Topology, size: int = PLAN_CACHE_SIZE) -> None:
        self.topology = topology
        self.size = size
        self._plans: dict[tuple[Any, ...], Compiled] = {}

    def get(self, collective: str, count: int, elem_size: int, algo: str, settings: PlannerConfig) -> Compiled:
        key = (collective, count, elem_size, algo, settings)
        entry = self._plans.pop(key, None)
        if entry is None:
            plan = make_plan(collective, count, elem_size, self.topology, algo, settings)
            entry = Compiled(plan, to_native(plan), plan_hash(plan))
            if len(self._plans) >= self.size:  # least recently used out (dicts keep insertion order)
                self._plans.pop(next(iter(self._plans)))
        self._plans[key] = entry  # (re)inserted last: the most recently used
        return entry

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
