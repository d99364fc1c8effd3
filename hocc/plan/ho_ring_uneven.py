"""`ho_ring` all-reduce on any placement: hosts of unequal size, switches with
unequal host counts, groups that take part of a host (docs/algorithms.md, "HO-Ring on
unequal hosts and sub-groups").

Each host cuts the chunk into as many equal parts as it has ranks (host
reduce-scatter: rank i of a host ends with part i, summed over the host). The
hosts' cuts differ, so their overlay splits the chunk into intervals (at most
sum(G_h) - N + 1 of them) on each of which every host has exactly one owner.
One ring per interval over its owners (one rank per host) all-reduces it:
a rank owns several intervals and sits on several rails, every ring spans
every host, so each host's NIC carries 2(N-1)/N * S in total, as on a uniform
grid, and every NIC is busy whichever ring runs. The host all-gather then
spreads the result inside each host, through the fast tier.

Three levels recurse: a switch's hosts reduce-scatter each interval of their
overlay among themselves (owner m of the interval keeps its m-th sub-interval),
the cross-switch all-reduce runs per interval of the switches' overlay, and
the all-gathers go back down. Levels where no node has two children (hosts of
one rank, switches of one host) have no steps for them.

Steps of the rail and switch levels hold several groups per rank (types.py),
listed in rounds of rings that share no rank (`in_rounds`), the same order on
every rank. All cut
points are exact fractions of the chunk; the chunk (`piece`) is rounded up to
their common denominator, so every segment is a whole number of elements (the
padding is zeros the caller never sees).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise
from math import lcm

from hocc.plan.types import GroupSlice, Layout, Plan, Step
from hocc.topology import TIERS, Topology

Part = list[tuple[Fraction, Fraction, int]]  # (start, end, owner) in fractions of a chunk, covering [0, 1)
Interval = tuple[Fraction, Fraction, tuple[int, ...]]  # (start, end, one owner per child, sorted)
MAX_UNIT = 1 << 16  # beyond this common denominator (rare: many odd sizes over 3 levels) padding costs too much


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


def in_rounds(groups: list[Interval]) -> list[Interval]:
    """Groups listed round by round: greedy colouring in offset order, so that
    no two groups of a round share a rank. Ranks run their groups in the listed
    order, so a round's rings run at once and a rank waits only for the rings
    it is in (its intervals are contiguous, so this colouring is optimal: as
    many rounds as the most intervals one rank owns)."""
    rounds: list[int] = []
    busy: dict[int, set[int]] = {}  # rank -> rounds it is in
    for _, _, members in sorted(groups):
        taken = set().union(*(busy.get(r, set()) for r in members))
        c = next(i for i in range(len(groups) + 1) if i not in taken)
        rounds.append(c)
        for r in members:
            busy.setdefault(r, set()).add(c)
    return [g for _, g in sorted(zip(rounds, sorted(groups), strict=True))]


def _levels(topo: Topology) -> list[list[list[tuple[int, ...]]]]:
    """Per level (host, switch, cluster), its nodes as lists of children, each
    child given by the ranks below it (rank order)."""
    switches = topo.switch_groups()
    hosts: list[list[tuple[int, ...]]] = [[(r,) for r in h] for s in switches for h in s]
    per_switch = [[h for h in s] for s in switches]
    root = [[tuple(r for h in s for r in h) for s in switches]]
    return [hosts, per_switch, root]


def uneven_steps(topo: Topology) -> tuple[list[tuple[str, str, list[Interval]]], int] | None:
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
        down.append(("reduce_scatter", TIERS[level], in_rounds(groups)))
        parts = new
    stages = [*down, ("all_reduce", TIERS[top], in_rounds(top_groups))]
    stages += [("all_gather", tier, groups) for _, tier, groups in reversed(down)]
    unit = 1
    for op, _, groups in stages:
        for a, b, members in groups:
            seg = b - a if op == "all_reduce" else (b - a) / len(members)
            unit = lcm(unit, a.denominator, seg.denominator)
            if unit > MAX_UNIT:
                return None
    return stages, unit


def build_ho_ring_uneven(collective: str, topo: Topology, count: int, chunks: int,
                         ring_ops: tuple[str, ...] = (), host_impl: str = "") -> Plan | None:
    """HO-Ring for any placement: the all-reduce by intervals (None when the
    cuts' common denominator is huge), reduce_scatter and all_gather by padded
    rails (ho_ring_uneven_rsag)."""
    if collective != "all_reduce":
        from hocc.plan.ho_ring_uneven_rsag import build_rsag_uneven  # it imports in_rounds from here
        return build_rsag_uneven(collective, topo, count, chunks, ring_ops, host_impl)
    built = uneven_steps(topo)
    if built is None:
        return None
    stages, unit = built
    chunks = max(1, min(chunks, count)) if count else 1
    piece = -(-count // chunks) if count else 0
    piece = -(-piece // unit) * unit
    layout = Layout(1, count, chunks, piece, (0,))
    steps: list[Step] = []
    for k in range(chunks):
        base = k * piece
        for stage, (op, tier, groups) in enumerate(stages):
            slices = []
            for a, b, members in groups:
                seg = b - a if op == "all_reduce" else (b - a) / len(members)
                slices.append(GroupSlice(members, base + int(a * piece), int(seg * piece)))
            impl = "ring" if op in ring_ops else "native"
            if host_impl and tier == "host":
                impl = host_impl
            steps.append(Step(stage, k, op, impl, tier, tuple(slices)))
    sizes = [len(h) for h in topo.host_groups()]
    return Plan(collective, "ho_ring", topo.world_size, count, layout, tuple(steps), max(len(stages), 1),
                meta={"hosts": sizes, "tiers": [t for _, t, _ in stages[:len(stages) // 2 + 1]],
                      "unit": unit, "uneven": True})
