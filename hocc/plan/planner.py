"""The planner: predicts every registered algorithm's time for a call
(hocc.plan.registry) and picks the fastest (`auto`), or builds the one asked
for, falling back (and saying so) when the topology does not allow it."""

from __future__ import annotations

from dataclasses import replace

from hocc.plan.algorithms import chunk_choices, predict_ho_ring, price_ho_ring
from hocc.plan.buffers import route_buffers
from hocc.plan.registry import PlannerConfig, Prediction, algorithm, names, with_role
from hocc.plan.types import COLLECTIVES, Plan
from hocc.topology import Topology

# PlannerConfig and Prediction live in hocc.plan.registry, HO-Ring's K in hocc.plan.algorithms
__all__ = ["PlannerConfig", "Prediction", "build_plan", "choose", "chunk_choices", "make_plan", "predict_all",
           "predict_ho_ring", "predicted", "price_ho_ring"]


def predict_all(collective: str, count: int, elem_size: int, topo: Topology,
                cfg: PlannerConfig | None = None) -> dict[str, Prediction]:
    """Predicted time of every registered algorithm that can run."""
    cfg = cfg or PlannerConfig()
    out = {}
    for name in names():
        pred = algorithm(name).predict(collective, topo, count, elem_size, cfg)
        if pred is not None:
            out[name] = pred
    return out


def choose(preds: dict[str, Prediction], cfg: PlannerConfig | None = None, collective: str = "") -> str:
    """auto's pick: the fastest predicted, but native unless the gain beats the
    margin. For an op in cfg.ring_ops (the engine's word that the backend's own
    op loses to a point-to-point ring, e.g. gloo's reduce-scatter at half a
    ring's speed) the ring is the default instead, unless the cost model
    prices that op's native factor: uncalibrated, the model sees native and
    ring move the same bytes and would keep native (3+5 at 200 Mbit/s: native
    reduce_scatter 26% of the link bound, the ring 52%)."""
    cfg = cfg or PlannerConfig()
    best = min(preds.values(), key=lambda p: p.seconds)
    priced = any(k == f"native:{collective}" for k, _ in cfg.params.op_factors)
    ring = with_role("ring")
    base = preds[ring] if collective in cfg.ring_ops and not priced and ring in preds else preds[with_role("backend")]
    if best.algo != base.algo and best.seconds > base.seconds * (1 - cfg.native_margin):
        return base.algo
    return best.algo


def make_plan(collective: str, count: int, elem_size: int, topo: Topology, algo: str = "auto",
              cfg: PlannerConfig | None = None) -> Plan:
    """The plan for one call: `count` is the element count per rank (all_reduce:
    the tensor; reduce_scatter: the output; all_gather: the input). A named
    algo is built without pricing the others (HO-Ring's K: cfg.chunks, else
    the model's); 'auto' prices all three and takes choose()'s pick."""
    cfg = cfg or PlannerConfig()
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    if algo != "auto":
        algorithm(algo)  # raises on a name not registered
    if algo == "auto":
        preds = predict_all(collective, count, elem_size, topo, cfg)
        pick = choose(preds, cfg, collective)
        reason = "auto: predicted " + ", ".join(f"{p.algo} {p.seconds * 1e3:.3f} ms" for p in preds.values())
        return build_plan(collective, count, elem_size, topo, pick, cfg, reason, preds[pick])
    return build_plan(collective, count, elem_size, topo, algo, cfg, "asked for")


def build_plan(collective: str, count: int, elem_size: int, topo: Topology, algo: str, cfg: PlannerConfig,
               reason: str, pred: Prediction | None = None) -> Plan:
    """One algorithm's plan, its predicted time attached (`pred`, else priced
    here); one that cannot run on `topo` runs its fallback, saying so. A
    chunked algorithm gets pred's K, else cfg.chunks, else its model's."""
    alg = algorithm(algo)
    k = 1
    if alg.chunked:
        k_pred = pred.chunks if pred is not None and pred.algo == algo else cfg.chunks
        if k_pred is None:
            pred = alg.predict(collective, topo, count, elem_size, cfg)
            k_pred = pred.chunks if pred is not None else 1
        k = k_pred
    plan = alg.build(collective, topo, count, cfg, k)
    if plan is None and alg.fallback is not None:
        reason = f"{algo}'s {collective} on topology {topo.shape()}: {alg.cannot}, so {alg.fallback} ran"
        return build_plan(collective, count, elem_size, topo, alg.fallback, cfg, reason)
    if plan is None:
        raise ValueError(f"{algo} cannot run {collective} on topology {topo.shape()}: {alg.cannot}")
    return _finish(plan, pred, reason, topo, elem_size, cfg)


def predicted(plan: Plan, topo: Topology, elem_size: int, cfg: PlannerConfig) -> float | None:
    """The cost model's time for a built plan (None: one the model cannot price):
    its algorithm's prediction at the plan's K."""
    alg = algorithm(plan.algo)
    pred = alg.predict(plan.collective, topo, plan.count, elem_size,
                       replace(cfg, chunks=plan.chunks) if alg.chunked else cfg)
    return pred.seconds if pred is not None else None


def _finish(plan: Plan, pred: Prediction | None, reason: str, topo: Topology, elem_size: int,
            cfg: PlannerConfig) -> Plan:
    secs = pred.seconds if pred is not None else predicted(plan, topo, elem_size, cfg)
    return route_buffers(replace(plan, predicted_s=secs, reason=reason))
