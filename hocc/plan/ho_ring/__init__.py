"""`ho_ring`: the hierarchical overlapping ring (PaRO-CC), docs/algorithms.md.

One builder for every placement: hosts of equal or unequal size, switches
with equal or unequal host counts, sub-groups that take part of a host, one
to three tiers (host, nic, trunk). A uniform grid is the case where every cut
falls on the same points and no slot is padding; nothing treats it apart.

  all_reduce      reduce-scatter down the tiers, one all-reduce per interval
                  of the top tier (one ring per interval over its owners, one
                  rank per host or switch), all-gather back up (all_reduce.py).
                  Each host's NIC carries 2(N-1)/N * S, as on a uniform grid.
  reduce_scatter  host reduce-scatter, then rails (one ring per row of block
  all_gather      slots over one rank per host, padded to the widest host)
                  and, across switches, trunk rails; all_gather the mirror
                  (rails.py).

The buffer is cut into K chunks that run as a pipeline (stage s of chunk k+1
overlaps stage s+1 of chunk k), and all groups of a stage run at once; a rank
on several rails runs them in rounds (hocc.plan.rounds). Groups whose members
are in rank order run the backend's collective unless the planner asks for
rings for that op (`ring_ops`); host-tier steps may go through shared memory
(`host_impl` 'shm', CPU only).
"""

from __future__ import annotations

from hocc.plan.ho_ring.all_reduce import MAX_UNIT, build_all_reduce
from hocc.plan.ho_ring.rails import build_rails
from hocc.plan.types import Plan
from hocc.topology import Topology

__all__ = ["MAX_UNIT", "build_ho_ring"]


def build_ho_ring(collective: str, topo: Topology, count: int, chunks: int, ring_ops: tuple[str, ...] = (),
                  host_impl: str = "") -> Plan | None:
    """The HO-Ring plan of `count` elements per block in `chunks` chunks, or
    None where the all-reduce's cuts would need a piece too large to pad to
    (MAX_UNIT)."""
    if collective == "all_reduce":
        return build_all_reduce(topo, count, chunks, ring_ops, host_impl)
    return build_rails(collective, topo, count, chunks, ring_ops, host_impl)
