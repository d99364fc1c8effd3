"""The planner: builds the candidate plans for a call and picks the fastest
predicted one (`auto`), or builds the one asked for, falling back (and saying
so) when the topology does not allow it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hocc.plan.cost import CostParams, predict
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.native import build_native
from hocc.plan.ring import build_ring, ring_tier
from hocc.plan.types import ALGOS, COLLECTIVES, Plan
from hocc.topology import Topology


@dataclass(frozen=True)
class PlannerConfig:
    """chunks: force HO-Ring's pipeline depth K (None: the cost model picks).
    min_chunk_bytes / max_chunks bound the K the cost model may pick.
    native_margin: auto leaves native only for a predicted gain above this.
    ring_ops: HO-Ring steps of these ops run as point-to-point rings instead of
    the backend's collective (the engine sets it per backend).
    host_impl: 'shm' runs HO-Ring's host-level reduce-scatter / all-gather
    through shared memory (CPU tensors); '' leaves them to native / ring_ops."""

    chunks: int | None = None
    min_chunk_bytes: int = 512 * 1024
    max_chunks: int = 32
    native_margin: float = 0.05
    ring_ops: tuple[str, ...] = ()
    host_impl: str = ""
    params: CostParams = field(default_factory=CostParams)


def _chunk_choices(count: int, elem_size: int, cfg: PlannerConfig) -> list[int]:
    if cfg.chunks is not None:
        return [max(1, cfg.chunks)]
    out, k = [1], 2
    while k <= cfg.max_chunks and count * elem_size / k >= cfg.min_chunk_bytes:
        out.append(k)
        k *= 2
    return out


def _best_ho_ring(collective: str, topo: Topology, count: int, elem_size: int,
                  cfg: PlannerConfig) -> Plan | None:
    best: Plan | None = None
    for k in _chunk_choices(count, elem_size, cfg):
        plan = build_ho_ring(collective, topo, count, k, cfg.ring_ops, cfg.host_impl)
        if plan is None:
            return None
        plan.predicted_s = predict(plan, topo, elem_size, cfg.params)
        if best is None or plan.predicted_s < best.predicted_s:  # type: ignore[operator]
            best = plan
    return best


def make_plan(collective: str, count: int, elem_size: int, topo: Topology, algo: str = "auto",
              cfg: PlannerConfig | None = None) -> Plan:
    """The plan for one call: `count` is the element count per rank (all_reduce:
    the tensor; reduce_scatter: the output; all_gather: the input)."""
    cfg = cfg or PlannerConfig()
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    if algo not in (*ALGOS, "auto"):
        raise ValueError(f"unknown algo {algo!r}; expected one of {(*ALGOS, 'auto')}")
    native = build_native(collective, topo.world_size, count, ring_tier(topo))
    native.predicted_s = predict(native, topo, elem_size, cfg.params)
    if algo == "native":
        native.reason = "asked for"
        return native
    ring = build_ring(collective, topo, count)
    ring.predicted_s = predict(ring, topo, elem_size, cfg.params)
    if algo == "ring":
        ring.reason = "asked for"
        return ring
    ho = _best_ho_ring(collective, topo, count, elem_size, cfg)
    if algo == "ho_ring":
        if ho is None:
            ring.reason = (f"ho_ring needs equal ranks per host and hosts per switch; topology "
                           f"{topo.shape()} is not, so the topology-ordered ring ran")
            return ring
        ho.reason = "asked for"
        return ho
    cands = [p for p in (native, ring, ho) if p is not None]
    best = min(cands, key=lambda p: p.predicted_s or 0.0)
    assert native.predicted_s is not None and best.predicted_s is not None
    if best is not native and best.predicted_s > native.predicted_s * (1 - cfg.native_margin):
        best = native
    preds = ", ".join(f"{p.algo} {p.predicted_s * 1e3:.3f} ms" for p in cands if p.predicted_s is not None)
    best.reason = f"auto: predicted {preds}"
    return best
