"""Bytes on the wire by formula: what a member of a ring sends, and the
least time a topology's shaped links allow for a collective (the byte counts
of docs/algorithms.md). The cost model prices plans step by step
(hocc.plan.cost); these closed forms serve the flight recorder, PaRO's
traffic model and hocc-bench's link bound."""

from __future__ import annotations

from hocc.topology import Topology


def call_bytes(collective: str, count: float, elem_size: int, world: int) -> float:
    """S, a call's size as nccl-tests states it, the one place it is written: all_reduce's buffer, the
    all_gather output and the reduce_scatter input (`world` blocks of `count` elements)."""
    return float(count * elem_size * (1 if collective == "all_reduce" else world))


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw over n members, the one place it is written:
    2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter (what
    each member's link carries per byte of the full buffer). Alone: 0."""
    if n < 2:
        return 0.0
    return (2 if collective == "all_reduce" else 1) * (n - 1) / n


def ring_volume(collective: str, n: int, count: int) -> tuple[float, int]:
    """What each member of a ring over n members sends, in elements, and in how
    many rounds: all_reduce of `count` elements 2(n-1)/n * count in 2(n-1);
    reduce_scatter and all_gather of `count`-element segments (n-1) * count in
    n-1; broadcast (a chain) (n-1)/n * count on average, in n-1. Alone: nothing."""
    if n < 2:
        return 0.0, 0
    if collective == "all_reduce":
        return 2 * (n - 1) / n * count, 2 * (n - 1)
    if collective == "broadcast":  # a chain from the first member: the last sends nothing
        return (n - 1) / n * count, n - 1
    return float((n - 1) * count), n - 1


def link_bound(collective: str, nbytes: int, topo: Topology) -> float | None:
    """The least time the shaped links allow (docs/algorithms.md's byte counts): over N
    > 1 hosts, each host NIC carries 2(N-1)/N * S for all-reduce, else
    (N-1)/N * S; over M > 1 switches, each trunk carries the same with M. A host's bytes
    spread over its NICs.
    `nbytes` is S, the full buffer. None on a single host."""
    hosts, switches = len(topo.host_groups()), len(topo.switch_groups())
    if hosts < 2:
        return None
    nics = min(h.nics for h in topo.host_infos())
    bound = bus_factor(collective, hosts) * nbytes / (topo.links.nic.bandwidth * nics)
    if switches > 1:
        bound = max(bound, bus_factor(collective, switches) * nbytes / topo.links.trunk.bandwidth)
    return bound
