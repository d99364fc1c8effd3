"""Plans (data), their builders, the cost model and the planner (no torch)."""

from hocc.plan.cost import CostParams, predict
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.simulate import PlanError, simulate
from hocc.plan.types import ALGOS, COLLECTIVES, GroupSlice, Layout, Plan, Step
from hocc.plan.volumes import link_bound

__all__ = [
    "ALGOS", "COLLECTIVES", "CostParams", "GroupSlice", "Layout", "Plan", "PlanError", "PlannerConfig", "Step",
    "link_bound", "make_plan", "predict", "simulate",
]
