"""Size-generic plans. Every builder here (native, ring, HO-Ring on any
placement) makes plans that are linear in their piece: the plan for `count`
elements with K chunks is the plan built for K elements (its "unit", one
smallest piece per chunk) with every offset, segment and piece multiplied by

    f = ceil(count / (K x unit piece))

and the caller's `count` as its block size. So a size never seen costs a
multiplication, not a plan build: the engine keeps one unit per (collective,
algo, K) and scales its C++ form (core/plan.h, Plan::scaled, which shares
the steps), and builds the Python plan only when someone reads it.
tests/test_shapes.py checks scaled units against the builders' own plans.

The buffer routing (hocc.plan.buffers) depends on the size only through
whether the layout is the identity, so a unit has two routed variants
(hocc.plan.buffers.route_as).
"""

from __future__ import annotations

from dataclasses import replace

from hocc.plan.planner import PlannerConfig
from hocc.plan.registry import algorithm
from hocc.plan.types import GroupSlice, Layout, Plan, chunks_for
from hocc.topology import Topology

__all__ = ["build_unit", "chunks_for", "factor", "scale", "scaled_layout"]


def build_unit(collective: str, topo: Topology, algo: str, cfg: PlannerConfig, chunks: int) -> Plan | None:
    """The unrouted unit of `algo` with `chunks` chunks (chunks_for's K; 1 for
    an unchunked algorithm), or None where it has none: a chunked algorithm
    with K left to the model (K then depends on the size), or one that cannot
    run on `topo` (hocc.plan.registry.Algorithm.unit)."""
    return algorithm(algo).unit(collective, topo, cfg, chunks)


def factor(unit: Plan, count: int) -> int:
    """The scale of `unit` for `count` elements per block."""
    per = unit.layout.chunks * unit.layout.piece
    return max(1, -(-count // per))


def scaled_layout(unit: Plan, count: int) -> Layout:
    lay = unit.layout
    return replace(lay, block_elems=count, piece=lay.piece * factor(unit, count))


def scale(variant: Plan, count: int) -> Plan:
    """The whole Python plan for `count` from a routed unit (route_as): what
    the builder would make, with `count` as the block size."""
    f = factor(variant, count)
    steps = tuple(replace(s, groups=tuple(GroupSlice(g.ranks, g.offset * f, g.seg * f) for g in s.groups))
                  for s in variant.steps)
    return replace(variant, count=count, layout=scaled_layout(variant, count), steps=steps, meta=dict(variant.meta))
