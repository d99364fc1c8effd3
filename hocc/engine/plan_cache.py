"""An engine's plan cache: per (collective, count, element size, algo,
planner settings), the C++ form of the plan (which compiles this rank's part
once, at its first run: core/plan.h), its hash for the call check, and
whether its communicators exist yet.

Plans are size-generic (hocc.plan.shapes): one unit per (collective, algo,
settings, K) is built, routed both ways, converted and hashed once; a new
size scales the unit's C++ form (sharing its steps) and hashes the unit's
hash with the count. No plan is built on the call's path and the Python plan
is built only when read (hocc.plan_for, last_plan, a failure's message, the
flight recorder's dump). HO-Ring named without a K gets the model's K for
the size, then that K's unit; count 0 and HO-Ring that cannot run on the
topology take the planner's path (make_plan). So HO-Ring asked for with or
without a K hashes alike where the plans are alike."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hocc.engine.agreement import plan_hash
from hocc.executor.cpp_form import to_cpp
from hocc.plan.buffers import is_identity, route_as
from hocc.plan.planner import PlannerConfig, make_plan, predicted
from hocc.plan.registry import algorithm
from hocc.plan.shapes import build_unit, chunks_for, factor, scale, scaled_layout
from hocc.plan.types import Plan
from hocc.topology import Topology

# Plans kept per engine, least recently used dropped first. A plan and its C++
# form take about 10 KiB (a scaled one shares its unit's steps): a loop over
# many distinct sizes (the soak) would otherwise grow RSS up to the cap, while
# a training loop uses a few dozen sizes.
PLAN_CACHE_SIZE = 256


@dataclass
class Setup:
    """Whether the communicators of a plan's groups exist (shared by every size of a unit)."""

    done: bool = False


@dataclass
class Variant:
    """A unit routed one way (hocc.plan.buffers.route_as): the plan, its C++ form, its hash."""

    plan: Plan
    cpp: Any
    hash: int


@dataclass
class GenericPlan:
    """One size-generic plan, both routings made when first needed."""

    plan: Plan
    setup: Setup = field(default_factory=Setup)
    variants: dict[bool, Variant] = field(default_factory=dict)
    in_order: bool = field(init=False)  # its blocks in rank order (part of whether a size's layout is the identity)

    def __post_init__(self) -> None:
        self.in_order = self.plan.layout.order == tuple(range(self.plan.layout.blocks))

    def variant(self, identity: bool) -> Variant:
        v = self.variants.get(identity)
        if v is None:
            p = route_as(self.plan, identity)
            v = self.variants[identity] = Variant(p, to_cpp(p), plan_hash(p))
        return v


class Compiled:
    """A cached plan: its C++ form (`cpp`), its hash (agreement.plan_hash,
    or a unit's hash with the count), its algo, and the Python plan, built
    on first read. `reason`, when set, replaces the plan's own (auto's)."""

    def __init__(self, cpp: Any, hash: int, algo: str, build: Callable[[], Plan], setup: Setup,
                 groups: Plan | None = None) -> None:
        self.cpp, self.hash, self.algo = cpp, hash, algo
        self.setup = setup
        self.reason: str | None = None
        self._build = build
        self._plan: Plan | None = None
        self._groups = groups

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = self._build()
        if self.reason is not None and self._plan.reason != self.reason:
            self._plan = replace(self._plan, reason=self.reason)
        return self._plan

    @property
    def groups(self) -> Plan:
        """A plan with this one's groups (its unit's, when scaled): what its communicators are set up from."""
        return self._groups if self._groups is not None else self.plan

    @staticmethod
    def of(plan: Plan) -> Compiled:
        return Compiled(to_cpp(plan), plan_hash(plan), plan.algo, lambda: plan, Setup())


class PlanCache:
    def __init__(self, topology: Topology, size: int = PLAN_CACHE_SIZE) -> None:
        self.topology = topology
        self.size = size
        self._plans: dict[tuple[Any, ...], Compiled] = {}
        self._units: dict[tuple[Any, ...], GenericPlan | None] = {}

    def get(self, collective: str, count: int, elem_size: int, algo: str, settings: PlannerConfig) -> Compiled:
        key = (collective, count, elem_size, algo, settings)
        entry = self._plans.pop(key, None)
        if entry is None:
            entry = self._make(collective, count, elem_size, algo, settings)
            if len(self._plans) >= self.size:  # least recently used out (dicts keep insertion order)
                self._plans.pop(next(iter(self._plans)))
        self._plans[key] = entry  # (re)inserted last: the most recently used
        return entry

    def _make(self, collective: str, count: int, elem_size: int, algo: str, settings: PlannerConfig) -> Compiled:
        alg = algorithm(algo)
        if alg.chunked and settings.chunks is None and count:  # K for this size by the model, then its unit
            pred = alg.predict(collective, self.topology, count, elem_size, settings)
            if pred is not None:
                settings = replace(settings, chunks=pred.chunks)
        unit = self._unit(collective, count, algo, settings) if count else None
        if unit is None:  # the planner's path
            return Compiled.of(make_plan(collective, count, elem_size, self.topology, algo, settings))
        lay = scaled_layout(unit.plan, count)
        v = unit.variant(is_identity(collective, lay, unit.in_order))
        f = factor(unit.plan, count)
        cpp = v.cpp.scaled(f, count, v.plan.work_at, v.plan.pack)
        digest = hashlib.blake2b(v.hash.to_bytes(8, "little") + count.to_bytes(8, "little"), digest_size=8)
        topo = self.topology

        def build() -> Plan:
            plan = scale(v.plan, count)
            return replace(plan, predicted_s=predicted(plan, topo, elem_size, settings), reason="asked for")

        return Compiled(cpp, int.from_bytes(digest.digest(), "little"), v.plan.algo, build, unit.setup, v.plan)

    def _unit(self, collective: str, count: int, algo: str, settings: PlannerConfig) -> GenericPlan | None:
        k = chunks_for(count, settings.chunks) if algorithm(algo).chunked and settings.chunks is not None else 1
        key = (collective, algo, settings, k)
        if key not in self._units:
            plan = build_unit(collective, self.topology, algo, settings, k)
            self._units[key] = GenericPlan(plan) if plan is not None else None
        return self._units[key]

    def clear(self) -> None:
        self._plans.clear()
        self._units.clear()

    def __len__(self) -> int:
        return len(self._plans)
