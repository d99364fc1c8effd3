"""`ho_ring`: the hierarchical overlapping ring (PaRO-CC), docs/algorithms.md.

On a grid of levels host (0), switch (1), cluster (2), with the buffer cut into
K chunks that run as a pipeline (stage s of chunk k+1 overlaps stage s+1 of
chunk k), and all groups of a level (e.g. all G rails) running at once:

  all_reduce      reduce-scatter at levels 0..d-2, all-reduce at level d-1 on
                  the smallest shard, all-gather at levels d-2..0.
                  Per host, top-tier bytes: 2(N-1)/N * S (flat ring: 2(W-1)/W * S).
  reduce_scatter  reduce-scatter at levels 0..d-1 over blocks packed by
                  coordinates (level 0 most significant); each rank ends with
                  its own block. Top-tier bytes per host: (N-1)/N * S.
  all_gather      the mirror: all-gather at levels d-1..0.

Groups whose members are in rank order run the backend's collective unless
the planner asks for rings for that op; others (unusual placements) run a
point-to-point ring in coordinate order. Host-level steps (reduce-scatter,
all-gather, and a single host's all-reduce) may run through shared memory
instead ('shm', CPU only).
"""

from __future__ import annotations

from math import prod

from hocc.plan.hierarchy import Grid, build_grid
from hocc.plan.ho_ring_uneven import build_ho_ring_uneven
from hocc.plan.types import GroupSlice, Layout, Plan, Step
from hocc.topology import Topology


def _impl(members: tuple[int, ...]) -> str:
    return "native" if list(members) == sorted(members) else "ring"


def _level_step(grid: Grid, level: int, stage: int, chunk: int, op: str, base: int,
                span: int, seg: int, ring_ops: tuple[str, ...] = (), host_impl: str = "") -> Step:
    """One step at `level`: each group works on the region its higher-level
    (more significant) coordinates select; `span` is that region's length."""
    groups = []
    for coord, members in grid.groups(level):
        prefix = 0
        for x, r in zip(coord[:level], grid.radices[:level], strict=True):
            prefix = prefix * r + x
        groups.append(GroupSlice(members, base + prefix * span, seg))
    native = op not in ring_ops and all(_impl(g.ranks) == "native" for g in groups)
    impl = "native" if native else "ring"
    if host_impl and grid.tiers[level] == "host":
        impl = host_impl
    return Step(stage, chunk, op, impl, grid.tiers[level], tuple(groups))


def build_ho_ring(collective: str, topo: Topology, count: int, chunks: int,
                  ring_ops: tuple[str, ...] = (), host_impl: str = "") -> Plan | None:
    """The HO-Ring plan; on a hierarchy that is not uniform, ho_ring_uneven's
    (all_reduce by intervals, or None where they are too fine; reduce_scatter
    and all_gather by padded rails).
    Steps whose op is in `ring_ops` run as point-to-point rings even where the
    backend's collective could run them (gloo's reduce-scatter and all-gather
    are slower than a ring; see the engine). `host_impl` ('shm') names the
    transport for the steps inside a host."""
    grid = build_grid(topo)
    if grid is None:  # unequal hosts or switches (ho_ring_uneven)
        return build_ho_ring_uneven(collective, topo, count, chunks, ring_ops, host_impl)
    world, d = topo.world_size, grid.depth
    chunks = max(1, min(chunks, count)) if count else 1
    steps: list[Step] = []
    if collective == "all_reduce":
        div = prod(grid.radices[:-1]) if d else 1
        piece = -(-count // chunks) if count else 0
        piece = -(-piece // div) * div
        layout = Layout(1, count, chunks, piece, (0,))
        for k in range(chunks):
            base, stage, span = k * piece, 0, piece
            for level in range(d - 1):
                seg = span // grid.radices[level]
                steps.append(_level_step(grid, level, stage, k, "reduce_scatter", base, span, seg, ring_ops, host_impl))
                span, stage = seg, stage + 1
            if d:
                steps.append(_level_step(grid, d - 1, stage, k, "all_reduce", base, span, span, ring_ops, host_impl))
                stage += 1
            for level in reversed(range(d - 1)):
                span = span * grid.radices[level]
                seg = span // grid.radices[level]
                steps.append(_level_step(grid, level, stage, k, "all_gather", base, span, seg, ring_ops, host_impl))
                stage += 1
        stages = max(2 * d - 1, 1)
    else:
        piece = -(-count // chunks) if count else 0
        at = grid.rank_at()
        order = [0] * world
        for c, r in at.items():
            order[grid.position(c)] = r
        layout = Layout(world, count, chunks, piece, tuple(order))
        levels = list(range(d)) if collective == "reduce_scatter" else list(reversed(range(d)))
        for k in range(chunks):
            base = k * world * piece
            for stage, level in enumerate(levels):
                span = prod(grid.radices[level:]) * piece
                seg = span // grid.radices[level]
                steps.append(_level_step(grid, level, stage, k, collective, base, span, seg, ring_ops, host_impl))
        stages = max(d, 1)
    plan = Plan(collective, "ho_ring", world, count, layout, tuple(steps), stages,
                meta={"radices": list(grid.radices), "tiers": list(grid.tiers)})
    return plan
