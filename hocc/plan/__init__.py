"""Plans (data), their builders, the algorithm registry, the cost model and the planner (no torch)."""

from hocc.plan.cost import CostParams, predict
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.registry import Algorithm, Prediction, algorithm, names, register
from hocc.plan.simulate import PlanError, simulate
from hocc.plan.types import COLLECTIVES, GroupSlice, Layout, Plan, Step
from hocc.plan.volumes import link_bound

__all__ = [
    "COLLECTIVES", "Algorithm", "CostParams", "GroupSlice", "Layout", "Plan", "PlanError", "PlannerConfig",
    "Prediction", "Step", "algorithm", "link_bound", "make_plan", "names", "predict", "register", "simulate",
]
