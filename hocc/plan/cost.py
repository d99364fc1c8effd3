"""Alpha-beta cost model with link sharing, read off plan data.

Every group of a step is modelled as a ring over its members in the listed
order (what gloo and NCCL run for native steps, and what hocc's ring steps
are). Each ring edge loads the links it crosses: the source host's loopback
(shared by all flows inside one host), the NIC out of the source host and into
the destination host, and across switches the trunk out of and into the
switches. All flows of concurrent steps share those links. The executor runs
a plan as a wavefront (tick t runs stage s of chunk t-s), so a tick costs its
slowest link or its longest latency chain, whichever is larger.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hocc.plan.types import Plan, Step
from hocc.topology import Topology

TIER_RANK = {"host": 0, "nic": 1, "trunk": 2}


@dataclass(frozen=True)
class CostParams:
    """Software costs that are not links: per-step launch, per Python ring
    hop, local copies (packing the work buffer), and the shared-memory host
    transport (memory bandwidth a host's ranks share, seconds per barrier). Defaults are the CPU
    testbed's (8 ranks on 2 cores); `hocc calibrate` is the way to fit them."""

    launch: float = 1.5e-3
    ring_step: float = 0.5e-3
    copy_bandwidth: float = 2e9
    shm_bandwidth: float = 3e9
    shm_barrier: float = 0.5e-3


Load = dict[tuple[str, str], float]


class _Places:
    def __init__(self, topo: Topology) -> None:
        self.host = {r: topo.host_of(r) for r in range(topo.world_size)}
        self.switch = {r: topo.switch_of(r) for r in range(topo.world_size)}


def _edge_links(a: int, b: int, places: _Places) -> tuple[str, list[tuple[str, str]]]:
    ha, hb = places.host[a], places.host[b]
    if ha == hb:
        return "host", [("host", ha)]
    links = [("nic_out", ha), ("nic_in", hb)]
    sa, sb = places.switch[a], places.switch[b]
    if sa != sb:
        return "trunk", [*links, ("trunk_out", sa), ("trunk_in", sb)]
    return "nic", links


def step_load(step: Step, elem_size: int, topo: Topology, places: _Places, params: CostParams) -> tuple[Load, float]:
    """Bytes per link, and the latency chain (seconds), of one step."""
    load: Load = defaultdict(float)
    latency = 0.0
    for g in step.groups:
        n = len(g.ranks)
        if n < 2:
            continue
        if step.impl == "shm":  # every member writes then reads through the host's memory
            per_member = (2 * n if step.op == "reduce_scatter" else n + 1) * g.seg * elem_size
            load[("shm", places.host[g.ranks[0]])] += n * per_member
            latency = max(latency, 2 * params.shm_barrier)
            continue
        if step.op == "all_reduce":
            hops, per_hop = 2 * (n - 1), g.seg / n * elem_size
        else:
            hops, per_hop = n - 1, g.seg * elem_size
        worst = 0.0
        for i, a in enumerate(g.ranks):
            tier, links = _edge_links(a, g.ranks[(i + 1) % n], places)
            worst = max(worst, topo.links.tier(tier).latency)
            for link in links:
                load[link] += hops * per_hop
        overhead = params.ring_step if step.impl == "ring" else 0.0
        latency = max(latency, hops * (worst + overhead))
    return load, latency


def _bandwidth(link: tuple[str, str], topo: Topology, params: CostParams) -> float:
    kind = link[0].split("_")[0]
    return params.shm_bandwidth if kind == "shm" else topo.links.tier(kind).bandwidth


def predict(plan: Plan, topo: Topology, elem_size: int, params: CostParams | None = None) -> float:
    """Predicted seconds for `plan` on `topo` (the group's topology)."""
    params = params or CostParams()
    places = _Places(topo)
    loads = {(s.stage, s.chunk): step_load(s, elem_size, topo, places, params) for s in plan.steps}
    total = 0.0
    ticks = plan.chunks + plan.stages - 1
    for t in range(ticks):
        active = [loads[(s, t - s)] for s in range(plan.stages) if (s, t - s) in loads]
        if not active:
            continue
        merged: Load = defaultdict(float)
        for load, _ in active:
            for link, b in load.items():
                merged[link] += b
        link_time = max((b / _bandwidth(link, topo, params) for link, b in merged.items()), default=0.0)
        lat = max(lat for _, lat in active)
        total += max(link_time, lat) + params.launch  # launches overlap the transfers in flight
    if plan.algo != "native":
        total += 2 * plan.layout.size * elem_size / params.copy_bandwidth
    return total


def link_bound(collective: str, nbytes: int, topo: Topology) -> float | None:
    """The least time the shaped links allow (HO-RING.md's byte counts): over N
    > 1 hosts, each host NIC carries 2(N-1)/N * S for all-reduce, else
    (N-1)/N * S; over M > 1 switches, each trunk carries the same with M.
    `nbytes` is S, the full buffer. None on a single host."""
    def factor(n: int) -> float:
        return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n

    hosts, switches = len(topo.host_groups()), len(topo.switch_groups())
    if hosts < 2:
        return None
    bound = factor(hosts) * nbytes / topo.links.nic.bandwidth
    if switches > 1:
        bound = max(bound, factor(switches) * nbytes / topo.links.trunk.bandwidth)
    return bound
