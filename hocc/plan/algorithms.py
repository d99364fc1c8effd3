"""The built-in algorithms, registered in hocc.plan.registry:

  native   the backend's own collective over the whole group (hocc.plan.native)
  ring     one ring over every rank in topology order (hocc.plan.ring)
  ho_ring  the hierarchical overlapping ring, pipelined over K chunks
           (hocc.plan.ho_ring); where its cuts are too fine to pad to, the ring
  host_rails  small all_reduce in two steps: inside each host, then across
           hosts on every rail (hocc.plan.host_rails); elsewhere ho_ring
  leaders  small calls with one rank per host on the network: inside each
           host, across hosts among the hosts' first ranks, then a broadcast
           inside each host (hocc.plan.leaders); elsewhere ho_ring

HO-Ring's K is chosen by pricing one chunk's plan run K times over (all
chunks are alike), so choosing among K = 1..32 on thousands of ranks builds no
32-chunk plan; only the winner is built."""

from __future__ import annotations

from typing import Any

from hocc.plan.cost import PlanCost, compile_pipeline, predict
from hocc.plan.ho_ring import MAX_UNIT, build_ho_ring
from hocc.plan.host_rails import CANNOT as HOST_RAILS_CANNOT
from hocc.plan.host_rails import build_host_rails
from hocc.plan.leaders import CANNOT as LEADERS_CANNOT
from hocc.plan.leaders import build_leaders, leaders_max_bytes
from hocc.plan.memo import memo
from hocc.plan.native import build_native
from hocc.plan.nccl_native import predict_nccl
from hocc.plan.registry import Algorithm, PlannerConfig, Prediction, register
from hocc.plan.ring import build_ring, ring_tier
from hocc.plan.types import Plan, chunks_for
from hocc.plan.volumes import call_bytes
from hocc.topology import Topology


def _native(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan:
    return build_native(collective, topo.world_size, count, ring_tier(topo))


def predict_native(collective: str, topo: Topology, count: int, elem_size: int, cfg: PlannerConfig) -> Prediction:
    if cfg.params.native == "nccl":  # what NCCL itself would run (hocc.plan.nccl_native)
        secs = predict_nccl(collective, topo, count, elem_size, cfg.params)[1]
    else:
        secs = predict(_native(collective, topo, count, cfg, 1), topo, elem_size, cfg.params)
    return Prediction("native", secs)


def _ring(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan:
    return build_ring(collective, topo, count)


def _predict_ring(collective: str, topo: Topology, count: int, elem_size: int, cfg: PlannerConfig) -> Prediction:
    return Prediction("ring", predict(build_ring(collective, topo, count), topo, elem_size, cfg.params))


def _ho_ring(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan | None:
    return build_ho_ring(collective, topo, count, chunks, cfg.ring_ops, cfg.host_impl)


def _host_rails(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan | None:
    return build_host_rails(collective, topo, count, cfg.ring_ops, cfg.host_impl)


def _predict_host_rails(collective: str, topo: Topology, count: int, elem_size: int,
                        cfg: PlannerConfig) -> Prediction | None:
    plan = _host_rails(collective, topo, count, cfg, 1)
    return None if plan is None else Prediction("host_rails", predict(plan, topo, elem_size, cfg.params))


def _leaders(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan | None:
    return build_leaders(collective, topo, count, cfg.ring_ops, cfg.host_impl)


def _predict_leaders(collective: str, topo: Topology, count: int, elem_size: int,
                     cfg: PlannerConfig) -> Prediction | None:
    """Priced up to leaders_max_bytes(topo), and where there are leaders and a host to hand the result to (None
    elsewhere: auto does not consider it, `algo="leaders"` still runs). On one host, or on hosts of one rank,
    its plan is HO-Ring's, and two rivals with one plan would cost a bucket trials for nothing. Not on GPUs
    (NCCL's costs): every GPU has its own NIC and proxy thread there, and the plan has not run on one."""
    hosts = topo.host_groups()
    if len(hosts) < 2 or max(map(len, hosts)) < 2 or cfg.params.native == "nccl":
        return None
    if call_bytes(collective, count, elem_size, topo.world_size) > leaders_max_bytes(topo, collective):
        return None
    plan = _leaders(collective, topo, count, cfg, 1)
    return None if plan is None else Prediction("leaders", predict(plan, topo, elem_size, cfg.params))


def chunk_choices(count: int, elem_size: int, cfg: PlannerConfig, total_bytes: int | None = None) -> list[int]:
    """The K the model may pick: powers of two while a chunk keeps min_chunk_bytes,
    at least the buffer over max_chunk_bytes; cfg.chunks alone where it is set."""
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
    whose cuts' common denominator is over hocc.plan.ho_ring.MAX_UNIT)."""
    best: Prediction | None = None
    total = int(call_bytes(collective, count, elem_size, topo.world_size))
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


NATIVE = register(Algorithm("native", "the backend's own collective over the whole group", _native, predict_native,
                            role="backend"))
RING = register(Algorithm("ring", "one ring over every rank, in topology order", _ring, _predict_ring, role="ring"))
HO_RING = register(Algorithm(
    "ho_ring", "the hierarchical overlapping ring, pipelined over K chunks", _ho_ring, predict_ho_ring,
    chunked=True, fallback="ring", price=price_ho_ring,
    cannot=f"its cuts would be too fine to pad to (common denominator over hocc.plan.ho_ring.MAX_UNIT = {MAX_UNIT})"))
HOST_RAILS = register(Algorithm(
    "host_rails", "small all_reduce in two steps: inside each host, then across hosts on every rail",
    _host_rails, _predict_host_rails, fallback="ho_ring", cannot=HOST_RAILS_CANNOT))
LEADERS = register(Algorithm(
    "leaders", "small calls with one rank per host on the network: host, the hosts' first ranks, a broadcast",
    _leaders, _predict_leaders, fallback="ho_ring", cannot=LEADERS_CANNOT))
