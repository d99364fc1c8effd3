"""HO-Ring's all-reduce by intervals, on any placement (docs/algorithms.md).

Each host cuts the chunk into as many equal parts as it has ranks (host
reduce-scatter: rank i of a host ends with part i, summed over the host). On
a uniform grid every host cuts at the same points; where hosts differ, their
overlay splits the chunk into intervals (at most sum(G_h) - N + 1 of them) on
each of which every host has exactly one owner. One ring per interval over
its owners (one rank per host) all-reduces it: a rank owns one interval per
rail (several where hosts differ), every ring spans every host, so each
host's NIC carries 2(N-1)/N * S in total and every NIC is busy whichever ring
runs. The host all-gather then spreads the result inside each host, through
the fast tier.

Three tiers recurse: a switch's hosts reduce-scatter each interval of their
overlay among themselves (owner m of the interval keeps its m-th
sub-interval), the cross-switch all-reduce runs per interval of the
switches' overlay, and the all-gathers go back down. Tiers where no node has
two children (hosts of one rank, switches of one host) have no steps.

All cut points are exact fractions of the chunk; the chunk (`piece`) is
rounded up to their common denominator (`unit`), so every segment is a whole
number of elements (the padding is zeros the caller never sees).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise
from math import lcm

from hocc.plan.ho_ring.stages import Stage, emit, step_impl
from hocc.plan.rounds import by_offset
from hocc.plan.types import Layout, Plan, chunks_for
from hocc.topology import TIERS, Topology

Part = list[tuple[Fraction, Fraction, int]]  # (start, end, owner) in fractions of a chunk, covering [0, 1)
Interval = tuple[Fraction, Fraction, tuple[int, ...]]  # (start, end, one owner per child, sorted)
MAX_UNIT = 1 << 16  # beyond this common denominator (rare: many odd sizes over 3 tiers) padding costs too much


def overlay(parts: list[Part]) -> list[Interval]:
    """The intervals on which every child's owner is constant; owners sorted by rank."""
    cuts = sorted({b for p in parts for s, e, _ in p for b in (s, e)})
    at = [0] * len(parts)
    out: list[Interval] = []
    for a, b in pairwise(cuts):
        owners = []
        for c, p in enumerate(parts):
            while p[at[c]][1] <= a:
                at[c] += 1
            owners.append(p[at[c]][2])
        members = tuple(sorted(owners))
        if out and out[-1][2] == members and out[-1][1] == a:
            out[-1] = (out[-1][0], b, members)  # same owners on both sides: one ring
        else:
            out.append((a, b, members))
    return out


def _levels(topo: Topology) -> list[list[list[tuple[int, ...]]]]:
    """Per tier (host, nic, trunk), its nodes (a host, a switch, the root) as
    lists of children, each child given by the ranks below it (rank order)."""
    switches = topo.switch_groups()
    hosts: list[list[tuple[int, ...]]] = [[(r,) for r in h] for s in switches for h in s]
    per_switch = [[h for h in s] for s in switches]
    root = [[tuple(r for h in s for r in h) for s in switches]]
    return [hosts, per_switch, root]


def interval_stages(topo: Topology) -> tuple[list[tuple[str, str, list[Interval]]], int] | None:
    """The all-reduce of one chunk as (op, tier, groups) per stage, in fractions
    of the chunk, and the common denominator of every cut; None when the
    denominator would exceed MAX_UNIT."""
    levels = _levels(topo)
    active = [any(len(node) > 1 for node in nodes) for nodes in levels]
    if not any(active):
        return [], 1
    top = max(i for i, a in enumerate(active) if a)
    parts: dict[tuple[int, ...], Part] = {(r,): [(Fraction(0), Fraction(1), r)] for r in range(topo.world_size)}
    down: list[tuple[str, str, list[Interval]]] = []
    top_groups: list[Interval] = []
    for level, nodes in enumerate(levels):
        if not active[level]:
            parts = {tuple(r for c in node for r in c): parts[node[0]] for node in nodes}
            continue
        groups: list[Interval] = []
        new: dict[tuple[int, ...], Part] = {}
        for node in nodes:
            key = tuple(r for c in node for r in c)
            if len(node) == 1:
                new[key] = parts[node[0]]
                continue
            ivs = overlay([parts[c] for c in node])
            if level == top:
                top_groups += ivs
                continue
            mine: Part = []
            for a, b, members in ivs:
                groups.append((a, b, members))
                seg = (b - a) / len(members)
                mine += [(a + i * seg, a + (i + 1) * seg, m) for i, m in enumerate(members)]
            new[key] = mine
        if level == top:
            break
        down.append(("reduce_scatter", TIERS[level], by_offset(groups)))
        parts = new
    stages = [*down, ("all_reduce", TIERS[top], by_offset(top_groups))]
    stages += [("all_gather", tier, groups) for _, tier, groups in reversed(down)]
    unit = 1
    for op, _, groups in stages:
        for a, b, members in groups:
            unit = lcm(unit, a.denominator, _seg(op, a, b, members).denominator)
            if unit > MAX_UNIT:
                return None
    return stages, unit


def _seg(op: str, a: Fraction, b: Fraction, members: tuple[int, ...]) -> Fraction:
    return b - a if op == "all_reduce" else (b - a) / len(members)


def build_all_reduce(topo: Topology, count: int, chunks: int, ring_ops: tuple[str, ...] = (),
                     host_impl: str = "") -> Plan | None:
    """The all-reduce plan (module docstring), or None when the cuts' common
    denominator is over MAX_UNIT."""
    built = interval_stages(topo)
    if built is None:
        return None
    fractions, unit = built
    chunks = chunks_for(count, chunks)
    piece = -(-count // chunks)
    piece = -(-piece // unit) * unit
    stages: list[Stage] = [
        (op, tier, step_impl(op, tier, [m for *_, m in groups], ring_ops, host_impl),
         [(int(a * unit), int(_seg(op, a, b, m) * unit), m) for a, b, m in groups])
        for op, tier, groups in fractions]
    layout = Layout(1, count, chunks, piece, (0,))
    return Plan("all_reduce", "ho_ring", topo.world_size, count, layout, emit(stages, chunks, piece, piece // unit),
                max(len(stages), 1), meta={"hosts": [len(h) for h in topo.host_groups()], "unit": unit,
                                           "tiers": [t for _, t, _ in fractions[:len(fractions) // 2 + 1]]})
