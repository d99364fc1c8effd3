"""HO-Ring's reduce_scatter and all_gather on any placement: rails, padded
where hosts differ (docs/algorithms.md).

A reduce-scatter or all-gather step gives every member of a group an equal
segment, while unequal hosts own unequal numbers of blocks. So every host is
padded to G_max block slots (G_max: the largest host's ranks): on one switch
the work buffer is a grid of rows, one rail per row, each row one block slot
per host; host h's slot in row g holds a real block in G_h of the G_max rows
and a pad slot (types.PAD_BLOCK: zeros on pack, skipped on unpack) in the
others. On a uniform grid there is no pad slot: the rows are the grid's rails
and a block's slot reads its (rank, host, switch) coordinates as digits.

  reduce_scatter  host reduce-scatter (the fast tier): each rank of host h
                  ends with q_h whole rows, summed over the host; then one
                  ring per row over its owners (one rank per host)
                  reduce-scatters the row, so each slot's rank ends with its
                  block summed over every host.
  all_gather      the mirror: rails all-gather each row (a rank brings its
                  own block, or a pad), then host all-gathers spread the rows.

Every rail spans every host and there are G_max of them, so each host's NIC
carries G_max(N-1) blocks: the least any plan can, (W - G_min) blocks, when
every host but the smallest is full (3+5, 4+4+3, 8+8+8+7, 1+7), and more
otherwise (2+5+8: 16 against 13, where the flat ring's W-1 = 14 is less; the
planner prices both). Pad slots cost NIC bytes only on hosts that are not the
busiest.

A node's equal split covers rows, not slots, so each of its c children gets q
= ceil(fan / c) consecutive positions (fan: the level's widest node) and its
real block sits in the first of them. When the last child would get no live
position ((c-1) q >= fan, e.g. 4 ranks beside 5), the node runs two passes of
q = floor(fan / c) positions per child instead (child i: i*q and c*q + i*q);
on hosts that is two host stages (one shared-memory group per rank per step),
above them two groups of one step. Positions past the fan that an equal split
covers are dead: all pad, no group. A rank whose positions hold several live
ones sits on several rails, run in rounds (hocc.plan.rounds).

Three levels (several switches): the same padding one level up. Slots are
digits (rank slot, host slot, switch), the rank slot most significant; a
switch with fewer hosts than the widest is padded with pad hosts; a switch
stage reduce-scatters each row among the switch's hosts, and trunk rails (one
rank per switch) finish each (rank slot, host slot) pair. Each trunk then
carries G_max H_max (M-1) blocks (M switches, H_max the widest switch's hosts)
instead of the flat rails' G_max (N-1); where the padding costs more than it
saves (e.g. switches of 3, 1 and 1 hosts), the flat rails over every host are
kept: the builder prices both by their busiest link, then their busiest trunk
(a tie goes to the tiered plan: on a uniform grid, the grid's own).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from math import prod

from hocc.plan.cost import step_load
from hocc.plan.ho_ring.stages import Stage, emit, step_impl
from hocc.plan.rounds import by_offset
from hocc.plan.types import PAD_BLOCK, Layout, Plan, chunks_for
from hocc.topology import TIERS, Topology


def host_passes(fan: int, c: int) -> tuple[int, int]:
    """(passes, positions per child per pass) for a node of c children on a level of `fan`."""
    q = -(-fan // c)
    if (c - 1) * q < fan:
        return 1, q
    return 2, fan // c


class _Node:
    """A host (children: ranks), a switch (children: host indices) or the root
    (children: switch indices), in segment order."""

    def __init__(self, children: tuple[int, ...], fan: int) -> None:
        self.children = children
        self.passes, self.q = host_passes(fan, len(children))
        self.span = len(children) * self.q  # positions per pass

    def owner(self, x: int) -> int:
        """The child that holds position x after this node's reduce-scatter."""
        return self.children[(x % self.span) // self.q]

    def block_at(self, x: int) -> int | None:
        """The child whose own block sits at position x, or None (pad)."""
        i, rest = divmod(x, self.q)
        return self.children[i] if not rest and i < len(self.children) else None


class _Tree:
    """Hosts, switches and the root as padded levels: radices (positions per
    level, dead ones included), fans (live positions), and the slot order."""

    def __init__(self, switches: list[list[tuple[int, ...]]]) -> None:
        host_ranks = [tuple(sorted(h)) for s in switches for h in s]
        first = [sum(len(s) for s in switches[:i]) for i in range(len(switches))]
        kids = [tuple(range(first[i], first[i] + len(s))) for i, s in enumerate(switches)]
        self.fans = (max(len(h) for h in host_ranks), max(len(k) for k in kids), len(switches))
        self.levels = [[_Node(h, self.fans[0]) for h in host_ranks], [_Node(k, self.fans[1]) for k in kids],
                       [_Node(tuple(range(len(switches))), self.fans[2])]]
        self.radices = tuple(max(fan, *(n.passes * n.span for n in nodes))
                             for fan, nodes in zip(self.fans, self.levels, strict=True))

    def stride(self, level: int) -> int:
        return prod(self.radices[level + 1:])

    def agent(self, level: int, node: int, prefix: tuple[int, ...]) -> int:
        """The rank that holds node's sum at the positions `prefix` (digits of
        levels 0..level) after the reduce-scatters of levels 0..level."""
        n = self.levels[level][node]
        child = n.owner(prefix[level])
        return child if level == 0 else self.agent(level - 1, child, prefix)

    def block(self, digits: tuple[int, int, int]) -> int:
        """The rank whose block sits at these digits, or PAD_BLOCK."""
        node: int | None = 0
        for level in (2, 1, 0):
            if digits[level] >= self.fans[level] or node is None:
                return PAD_BLOCK
            node = self.levels[level][node].block_at(digits[level])
        return PAD_BLOCK if node is None else node

    def order(self) -> list[int]:
        r0, r1, r2 = self.radices
        return [self.block((a, b, c)) for a in range(r0) for b in range(r1) for c in range(r2)]


def _level_groups(tree: _Tree, level: int, order: list[int]) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """Per pass, the (offset, seg, members) of level's groups in slots of one
    chunk; prefixes of dead positions and regions of nothing but pad are left out."""
    stride = tree.stride(level)
    passes: list[list[tuple[int, int, tuple[int, ...]]]] = [[], []]
    prefixes: list[tuple[int, ...]] = [()]
    for k in range(level):
        prefixes = [(*p, x) for p in prefixes for x in range(tree.fans[k])]
    for n in tree.levels[level]:
        if len(n.children) < 2:
            continue
        for prefix in prefixes:
            base = sum(x * tree.stride(k) for k, x in enumerate(prefix))
            for p in range(n.passes):
                start = p * n.span
                members = tuple(c if level == 0 else tree.agent(level - 1, c, (*prefix, start + i * n.q))
                                for i, c in enumerate(n.children))
                off, seg = base + start * stride, n.q * stride
                if any(b != PAD_BLOCK for b in order[off:off + len(members) * seg]):
                    passes[p].append((off, seg, members))
    return [g for g in passes if g]


def _build(collective: str, tree: _Tree, world: int, count: int, chunks: int, ring_ops: tuple[str, ...],
           host_impl: str, tiers: tuple[str, ...] = TIERS) -> Plan:
    order = tree.order()
    slots = len(order)
    chunks = chunks_for(count, chunks)
    piece = -(-count // chunks)
    layout = Layout(slots, count, chunks, piece, tuple(order))
    stages: list[Stage] = []  # one chunk's, in reduce-scatter order
    for level in range(3):
        per_pass = _level_groups(tree, level, order)
        if not per_pass:
            continue
        if level == 0:  # shared memory: one group per rank per step, so one stage per pass
            for groups in per_pass:
                stages.append((collective, "host", step_impl(collective, "host", [m for *_, m in groups], ring_ops,
                                                              host_impl), groups))
            continue
        ivs = [(Fraction(off), Fraction(off + len(m) * seg), m) for p in per_pass for off, seg, m in p]
        seg_of = {(off, m): seg for p in per_pass for off, seg, m in p}
        groups = [(int(a), seg_of[(int(a), m)], m) for a, _, m in by_offset(ivs)]
        stages.append((collective, tiers[level], step_impl(collective, tiers[level], [m for *_, m in groups],
                                                            ring_ops, ""), groups))
    if collective == "all_gather":  # the mirror, but host passes in pass order (independent: disjoint rows)
        stages = [s for s in reversed(stages) if s[1] != "host"] + [s for s in stages if s[1] == "host"]
    hosts = tree.levels[0]
    return Plan(collective, "ho_ring", world, count, layout, emit(stages, chunks, slots * piece, piece),
                max(len(stages), 1),
                meta={"hosts": [len(h.children) for h in hosts], "fans": list(tree.fans),
                      "radices_padded": list(tree.radices), "rails": tree.fans[0],
                      "tiers": [s[1] for s in stages], "host_passes": [h.passes for h in hosts],
                      "padded": PAD_BLOCK in order})


def _busiest(plan: Plan, topo: Topology) -> tuple[float, float]:
    """Seconds on the busiest NIC or trunk direction, then on the busiest trunk
    direction, if every group ran alone at line rate (the cost model's per-link
    bytes, hocc.plan.cost.step_load)."""
    load: Counter[tuple[str, str]] = Counter()
    for s in plan.steps:
        load.update(step_load(s, 1, topo)[0])
    rate = {"nic": topo.links.nic.bandwidth, "trunk": topo.links.trunk.bandwidth}
    secs = [(kind.split("_")[0], v / rate[kind.split("_")[0]]) for (kind, _), v in load.items()
            if kind.split("_")[0] in rate]
    return max((t for _, t in secs), default=0.0), max((t for k, t in secs if k == "trunk"), default=0.0)


def build_rails(collective: str, topo: Topology, count: int, chunks: int,
                ring_ops: tuple[str, ...] = (), host_impl: str = "") -> Plan:
    """The rail plan (module docstring) of reduce_scatter or all_gather; `count` is the block size."""
    switches = topo.switch_groups()
    flat = _Tree([[h for s in switches for h in s]])
    if len(switches) == 1:
        return _build(collective, flat, topo.world_size, count, chunks, ring_ops, host_impl)
    # rails over every host cross the trunks: their tier is the trunk's
    trees = {"flat": (flat, ("host", "trunk", "trunk")), "tiered": (_Tree(switches), TIERS)}
    secs = {k: _busiest(_build(collective, t, topo.world_size, 1, 1, ring_ops, host_impl, tiers), topo)
            for k, (t, tiers) in trees.items()}
    # a tie on the busiest link (the NICs, under a fast trunk) goes to the lighter trunk, then to the tiers
    tree, tiers = trees["tiered" if secs["tiered"] <= secs["flat"] else "flat"]
    return _build(collective, tree, topo.world_size, count, chunks, ring_ops, host_impl, tiers)
