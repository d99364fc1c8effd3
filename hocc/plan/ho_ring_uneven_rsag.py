"""`ho_ring` reduce_scatter and all_gather on unequal hosts: padded rails.

A reduce-scatter or all-gather step gives every member of a group an equal
segment, while unequal hosts own unequal numbers of blocks. So every host is
padded to G_max block slots (G_max: the largest host's ranks): the work
buffer is a grid of rows, one rail per row, each row one block slot per host;
host h's slot in row g holds a real block in G_h of the G_max rows and a pad
slot (types.PAD_BLOCK: zeros on pack, skipped on unpack) in the others.

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

Host h's reduce-scatter splits rows, not slots, so each of its G_h ranks gets
q_h = ceil(G_max / G_h) consecutive rows and its real block sits in the first
of them. When the last rank would get no live row ((G_h-1) q_h >= G_max, e.g.
4 ranks beside 5), the host runs two passes of q_h = floor(G_max / G_h) rows
per rank instead (rank i: rows i*q and G_h*q + i*q), in two host stages. Rows
past G_max that a host's equal split covers are dead: all pad, no rail. A rank
whose rows hold several live rows sits on several rails, run in rounds
(ho_ring_uneven.in_rounds).

Three levels: rails span every host, ordered switch by switch, so each trunk
carries what each NIC does (G_max(N-1) blocks); the switch tier gets no stage
of its own here.
"""

from __future__ import annotations

from fractions import Fraction

from hocc.plan.ho_ring_uneven import in_rounds
from hocc.plan.types import PAD_BLOCK, GroupSlice, Layout, Plan, Step
from hocc.topology import Topology


def host_passes(g_max: int, g: int) -> tuple[int, int]:
    """(passes, rows per rank per pass) for a host of g ranks beside the largest of g_max."""
    q = -(-g_max // g)
    if (g - 1) * q < g_max:
        return 1, q
    return 2, g_max // g


class _Host:
    """One host's ranks (rank order, the host group's segment order) and which rows each owns."""

    def __init__(self, ranks: tuple[int, ...], g_max: int) -> None:
        self.ranks = tuple(sorted(ranks))
        self.passes, self.q = host_passes(g_max, len(ranks))
        self.span = len(ranks) * self.q  # rows per pass

    def owner(self, row: int) -> int:
        return self.ranks[(row % self.span) // self.q]

    def block_at(self, row: int) -> int:
        """The rank whose block this host puts in `row`, or PAD_BLOCK."""
        i, rest = divmod(row, self.q)
        return self.ranks[i] if not rest and i < len(self.ranks) else PAD_BLOCK


def padded_rails(topo: Topology) -> tuple[list[_Host], list[tuple[int, ...]], int, list[int]]:
    """The hosts (switch by switch), each live row's rail (its owner on every
    host, in host order), the number of rows, and the slot order (blocks by
    row, then by host)."""
    hosts_ranks = [h for s in topo.switch_groups() for h in s]
    g_max = max(len(h) for h in hosts_ranks)
    hosts = [_Host(h, g_max) for h in hosts_ranks]
    rows = max(g_max, *(h.passes * h.span for h in hosts))
    rails = [tuple(h.owner(g) for h in hosts) for g in range(g_max)]
    order = [h.block_at(g) if g < g_max else PAD_BLOCK for g in range(rows) for h in hosts]
    return hosts, rails, rows, order


def _impl(op: str, groups: list[tuple[int, ...]], ring_ops: tuple[str, ...]) -> str:
    native = op not in ring_ops and all(list(m) == sorted(m) for m in groups)
    return "native" if native else "ring"


def build_rsag_uneven(collective: str, topo: Topology, count: int, chunks: int,
                      ring_ops: tuple[str, ...] = (), host_impl: str = "") -> Plan:
    """The padded-rail plan (module docstring); `count` is the block size."""
    hosts, rails, rows, order = padded_rails(topo)
    n = len(hosts)
    chunks = max(1, min(chunks, count)) if count else 1
    piece = -(-count // chunks) if count else 0
    layout = Layout(rows * n, count, chunks, piece, tuple(order))
    row_len = n * piece
    # rails in rounds of rings that share no rank (the order every rank runs them in)
    ivs = [(Fraction(g), Fraction(g + 1), members) for g, members in enumerate(rails)]
    rounds = [(int(a), members) for a, _, members in in_rounds(ivs)]
    rail_tier = "trunk" if len(topo.switch_groups()) > 1 else "nic"
    rail_impl = _impl(collective, [m for _, m in rounds], ring_ops)
    passes = max(h.passes for h in hosts)
    host_groups = [h for h in hosts if len(h.ranks) > 1]
    host_op_impl = host_impl or _impl(collective, [h.ranks for h in host_groups], ring_ops)
    steps: list[Step] = []
    for k in range(chunks):
        base = k * rows * row_len
        rail = Step(0, k, collective, rail_impl, rail_tier,
                    tuple(GroupSlice(m, base + g * row_len, piece) for g, m in rounds))
        host_steps = [Step(p, k, collective, host_op_impl, "host",
                           tuple(GroupSlice(h.ranks, base + p * h.span * row_len, h.q * row_len)
                                 for h in host_groups if h.passes > p))
                      for p in range(passes)]
        host_steps = [s for s in host_steps if s.groups]
        seq = [*host_steps, rail] if collective == "reduce_scatter" else [rail, *host_steps]
        steps += [Step(i, s.chunk, s.collective, s.impl, s.tier, s.groups) for i, s in enumerate(seq)]
    stages = max((s.stage for s in steps), default=0) + 1
    return Plan(collective, "ho_ring", topo.world_size, count, layout, tuple(steps), stages,
                meta={"hosts": [len(h.ranks) for h in hosts], "rows": rows, "rails": len(rails),
                      "tiers": (["host"] if host_groups else []) + [rail_tier],
                      "host_passes": [h.passes for h in hosts], "uneven": True, "padded": True})
