"""`ring`: one flat ring of point-to-point steps, visiting ranks host by host.

all_reduce of S elements over W ranks: a ring reduce-scatter then a ring
all-gather of S/W-element segments, 2(W-1) steps, each rank sending
2(W-1)/W * S elements; the ring leaves each host once, so each host's NIC
carries that much whatever the rank numbering.
reduce_scatter / all_gather of W blocks of c: W-1 steps of c elements.
"""

from __future__ import annotations

from hocc.plan.types import GroupSlice, Layout, Plan, Step
from hocc.topology import Topology


def ring_tier(topo: Topology) -> str:
    if len(topo.switch_groups()) > 1:
        return "trunk"
    return "nic" if len(topo.host_groups()) > 1 else "host"


def build_ring(collective: str, topo: Topology, count: int) -> Plan:
    world = topo.world_size
    order = tuple(topo.ordered_ranks())
    tier = ring_tier(topo)
    if collective == "all_reduce":
        seg = -(-count // world) if count else 0
        layout = Layout(1, count, 1, seg * world, (0,))
        steps = [Step(0, 0, "reduce_scatter", "ring", tier, (GroupSlice(order, 0, seg),)),
                 Step(1, 0, "all_gather", "ring", tier, (GroupSlice(order, 0, seg),))]
        stages = 2
    else:
        layout = Layout(world, count, 1, count, order)
        steps = [Step(0, 0, collective, "ring", tier, (GroupSlice(order, 0, count),))]
        stages = 1
    return Plan(collective, "ring", world, count, layout, tuple(steps), stages,
                meta={"ring_order": list(order)})
