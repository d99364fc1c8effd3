"""The planner: predicts each algorithm's time for a call and picks the
fastest (`auto`), or builds the one asked for, falling back (and saying so)
when the topology does not allow it.

HO-Ring's pipeline depth K is chosen by pricing one chunk's plan run K times
over (all chunks are alike), so choosing among K = 1..32 on thousands of ranks
builds no 32-chunk plan; only the winner is built."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hocc.plan.buffers import route_buffers
from hocc.plan.cost import CostParams, PlanCost, compile_pipeline, predict
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.memo import memo
from hocc.plan.native import build_native
from hocc.plan.nccl_native import predict_nccl
from hocc.plan.ring import build_ring, ring_tier
from hocc.plan.types import ALGOS, COLLECTIVES, Plan, chunks_for
from hocc.topology import Topology


@dataclass(frozen=True)
class PlannerConfig:
    """chunks: force HO-Ring's pipeline depth K (None: the cost model picks).
    min_chunk_bytes / max_chunks bound the K the cost model may pick.
    native_margin: auto leaves native only for a predicted gain above this.
    ring_ops: HO-Ring steps of these ops run as point-to-point rings instead of
    the backend's collective (the engine sets it per backend).
    host_impl: 'shm' runs HO-Ring's host-level steps through shared memory
    (CPU tensors); '' leaves them to native / ring_ops.
    max_chunk_bytes: K is at least the buffer over this. Large single messages
    through a shaped TCP link lose throughput, which the byte model does not
    see (2x4 @ 200 Mbit/s, 64 MiB all_gather: 52% of the link bound at K=1,
    68% at K=4, 82% at K=32; but at 1 Gbit/s, where the CPU is the limit,
    K=4 beat K=32); the engine sets it to 0.1 s of NIC time for gloo."""

    chunks: int | None = None
    min_chunk_bytes: int = 512 * 1024
    max_chunks: int = 32
    native_margin: float = 0.05
    ring_ops: tuple[str, ...] = ()
    host_impl: str = ""
    max_chunk_bytes: int | None = None
    params: CostParams = field(default_factory=CostParams)


@dataclass(frozen=True)
class Prediction:
    """One algorithm's predicted seconds for a call (`chunks`: HO-Ring's K)."""

    algo: str
    seconds: float
    chunks: int = 1


def chunk_choices(count: int, elem_size: int, cfg: PlannerConfig, total_bytes: int | None = None) -> list[int]:
    if cfg.chunks is not None:
        return [max(1, cfg.chunks)]
    out, k = [1], 2
    while k <= cfg.max_chunks and count * elem_size / k >= cfg.min_chunk_bytes:
        out.append(k)
        k *= 2
    if cfg.max_chunk_bytes and total_bytes:
        least = min(cfg.max_chunks, -(-total_bytes // cfg.max_chunk_bytes))
        out = [k for k in out if k >= least] or [least]
    return out


def predict_ho_ring(collective: str, topo: Topology, count: int, elem_size: int,
                    cfg: PlannerConfig) -> Prediction | None:
    """The best K and its time, or None when ho_ring cannot run (an all_reduce
    on unequal hosts whose cuts' common denominator is huge, hocc.plan.ho_ring.all_reduce)."""
    best: Prediction | None = None
    total = count * elem_size * (1 if collective == "all_reduce" else topo.world_size)
    for k in chunk_choices(count, elem_size, cfg, total):
        priced = price_ho_ring(collective, topo, count, elem_size, cfg, k)
        if priced is None:
            return None
        k_eff, cost = priced
        secs = cost.evaluate(topo.links, cfg.params)
        if best is None or secs < best.seconds:
            best = Prediction("ho_ring", secs, k_eff)
    return best


def price_ho_ring(collective: str, topo: Topology, count: int, elem_size: int, cfg: PlannerConfig,
                  chunks: int) -> tuple[int, PlanCost] | None:
    """The compiled cost of HO-Ring with `chunks` chunks (and the K it really
    gets: no more chunks than elements), without building that plan."""
    unit = _unit_chunk(collective, topo, cfg)
    if unit is None:
        return None
    k_eff = chunks_for(count, chunks)
    piece = -(-count // k_eff)  # a chunk's elements; all_reduce rounds up to the unit plan's piece
    piece = -(-piece // unit.layout.piece) * unit.layout.piece
    return k_eff, compile_pipeline(unit, k_eff, topo, elem_size, piece / unit.layout.piece)


def _unit_chunk(collective: str, topo: Topology, cfg: PlannerConfig) -> Plan | None:
    """One chunk's HO-Ring plan at the smallest piece (every step's segment is
    that piece times a constant), built once per topology object."""
    cache: dict[Any, Plan | None] = memo(topo, "ho_ring_units", dict)
    key = (collective, cfg.ring_ops, cfg.host_impl)
    if key not in cache:
        cache[key] = build_ho_ring(collective, topo, 1, 1, cfg.ring_ops, cfg.host_impl)
    plan: Plan | None = cache[key]
    return plan


def predict_all(collective: str, count: int, elem_size: int, topo: Topology,
                cfg: PlannerConfig | None = None) -> dict[str, Prediction]:
    """Predicted time of every algorithm that can run (native, ring, ho_ring)."""
    cfg = cfg or PlannerConfig()
    out = {
        "native": Prediction("native", _predict_native(collective, count, elem_size, topo, cfg)),
        "ring": Prediction("ring", predict(build_ring(collective, topo, count), topo, elem_size, cfg.params)),
    }
    ho = predict_ho_ring(collective, topo, count, elem_size, cfg)
    if ho is not None:
        out["ho_ring"] = ho
    return out


def _predict_native(collective: str, count: int, elem_size: int, topo: Topology, cfg: PlannerConfig) -> float:
    if cfg.params.native == "nccl":  # what NCCL itself would run (hocc.plan.nccl_native)
        return predict_nccl(collective, topo, count, elem_size, cfg.params)[1]
    return predict(build_native(collective, topo.world_size, count, ring_tier(topo)), topo, elem_size, cfg.params)


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
    base = preds["ring"] if collective in cfg.ring_ops and not priced and "ring" in preds else preds["native"]
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
    if algo not in (*ALGOS, "auto"):
        raise ValueError(f"unknown algo {algo!r}; expected one of {(*ALGOS, 'auto')}")
    if algo == "auto":
        preds = predict_all(collective, count, elem_size, topo, cfg)
        pick = choose(preds, cfg, collective)
        reason = "auto: predicted " + ", ".join(f"{p.algo} {p.seconds * 1e3:.3f} ms" for p in preds.values())
        return build_plan(collective, count, elem_size, topo, pick, cfg, reason, preds[pick])
    return build_plan(collective, count, elem_size, topo, algo, cfg, "asked for")


def build_plan(collective: str, count: int, elem_size: int, topo: Topology, algo: str, cfg: PlannerConfig,
               reason: str, pred: Prediction | None = None) -> Plan:
    """One algorithm's plan, its predicted time attached (`pred`, else priced
    here); ho_ring that cannot run on `topo` falls back to the ring, saying so."""
    if algo == "ho_ring":
        k = cfg.chunks if pred is None or pred.algo != "ho_ring" else pred.chunks
        if k is None:
            ho_pred = predict_ho_ring(collective, topo, count, elem_size, cfg)
            k = ho_pred.chunks if ho_pred is not None else 1
            pred = ho_pred
        plan = build_ho_ring(collective, topo, count, k, cfg.ring_ops, cfg.host_impl)
        if plan is not None:
            return _finish(plan, pred, reason, topo, elem_size, cfg)
        algo, pred = "ring", None
        reason = (f"ho_ring's {collective} on topology {topo.shape()} would need cuts too fine to pad to "
                  f"(hocc.plan.ho_ring.MAX_UNIT), so the topology-ordered ring ran")
    if algo == "native":
        plan = build_native(collective, topo.world_size, count, ring_tier(topo))
    else:
        plan = build_ring(collective, topo, count)
    return _finish(plan, pred, reason, topo, elem_size, cfg)


def predicted(plan: Plan, topo: Topology, elem_size: int, cfg: PlannerConfig) -> float | None:
    """The cost model's time for a built plan (None: HO-Ring the model cannot price)."""
    if plan.algo == "native":
        return _predict_native(plan.collective, plan.count, elem_size, topo, cfg)
    if plan.algo == "ho_ring":
        priced = price_ho_ring(plan.collective, topo, plan.count, elem_size, cfg, plan.chunks)
        return priced[1].evaluate(topo.links, cfg.params) if priced else None
    return predict(plan, topo, elem_size, cfg.params)


def _finish(plan: Plan, pred: Prediction | None, reason: str, topo: Topology, elem_size: int,
            cfg: PlannerConfig) -> Plan:
    secs = pred.seconds if pred is not None else predicted(plan, topo, elem_size, cfg)
    return route_buffers(replace(plan, predicted_s=secs, reason=reason))
