"""`leaders`: small calls with one rank per host on the network (docs/algorithms.md, "Small calls").

  stage 0  every host gathers its part among its ranks (shared memory on CPU):
           all_reduce sums the host's buffers, all_gather collects its blocks
  stage 1  the hosts' leaders (each host's first rank) run the collective
           across hosts: all_reduce the host sums, all_gather the hosts' blocks
  stage 2  each leader broadcasts the result to its host

reduce_scatter runs as an all_reduce of the whole input, each rank keeping its
own block (at the sizes this plan is for, the extra bytes cost less than a step).

host_rails and HO-Ring put every rank of a host on the network at once: on
hosts whose ranks outnumber their cores (the CPU testbed: 4 ranks to a core)
each rank's message through the kernel costs CPU time that the host's other
ranks wait for, and G messages per host per step cost G times that. Here one
rank per host sends and receives, for one more host-local step (a barrier):
on the emulated 2x4, a 32 B all_reduce 115-126 us a call as host_rails, 69-80
us as this plan. The cost model prices the trade (CostParams.host_message).

all_gather and reduce_scatter need hosts of one size (the leaders' segments
are equal); all_reduce runs on any hosts.

auto considers it up to leaders_max_bytes() (nccl-tests' size: the all_reduce
buffer, the all_gather output, the reduce_scatter input): 16 KiB at a 200 Mbit/s
NIC, as much NIC time at a faster one, at most 64 KiB (reduce_scatter, which
moves twice HO-Ring's bytes, 16 KiB everywhere). Above that its stages,
one chunk of the whole buffer each, tie HO-Ring on the links at best (emulated
3+5 at 200 Mbit/s, all_reduce: 1 MiB 44.2 against 44.4 ms, 16 MiB 744 against
726) and lose where reduce_scatter moves the whole input (32 KiB on 2x4 at
200 Mbit/s: 1.40 against 0.70 ms; at 1 Gbit/s 32 KiB still wins: all_gather
0.2 against 0.3 ms); the model prices the ties as ties, and a tie would cost a
bucket trials for nothing. Pipelined over K chunks (tried, not kept) it lost
at 64 MiB on 2x4 at 1 Gbit/s, 1.0-1.5 s against HO-Ring's 0.63: one flow per
host pair idles while its leader reduces and copies, where a rail per rank
fills the gaps (bench/results/peers/1gbit-after-chunks/).
"""

from __future__ import annotations

from hocc.plan.ho_ring.stages import step_impl
from hocc.plan.ring import ring_tier
from hocc.plan.types import GroupSlice, Layout, Plan, Step
from hocc.topology import Topology

LEADERS_MAX_BYTES = 16 << 10  # at a 200 Mbit/s NIC (0.66 ms of it)
LEADERS_MOST_BYTES = 64 << 10
CANNOT = "its all_gather and reduce_scatter need hosts of one size (the leaders' segments are equal)"


def build_leaders(collective: str, topo: Topology, count: int, ring_ops: tuple[str, ...] = (),
                  host_impl: str = "") -> Plan | None:
    """The three-step plan for `count` elements per block, or None where it cannot run (CANNOT)."""
    hosts = [tuple(h) for h in topo.host_groups()]
    world = topo.world_size
    if collective != "all_reduce" and len({len(h) for h in hosts}) != 1:
        return None
    leaders = tuple(h[0] for h in hosts)
    if collective == "all_reduce":
        layout, total = Layout(1, count, 1, count, (0,)), count
    else:  # a block per rank, each host's blocks together (all_gather's leaders exchange a host's at once)
        order = tuple(r for h in hosts for r in h) if collective == "all_gather" else tuple(range(world))
        layout, total = Layout(world, count, 1, count, order), world * count
    whole = "all_reduce" if collective == "reduce_scatter" else collective

    def host_part() -> tuple[GroupSlice, ...]:
        if whole == "all_reduce":
            return tuple(GroupSlice(h, 0, total) for h in hosts)
        starts = [sum(map(len, hosts[:i])) for i in range(len(hosts))]
        return tuple(GroupSlice(h, s * count, count) for h, s in zip(hosts, starts, strict=True))

    stages: list[tuple[str, str, tuple[GroupSlice, ...]]] = []
    shared = max(map(len, hosts)) > 1  # some host has ranks to gather and to hand the result to
    if shared:
        stages.append((whole, "host", host_part()))
    if len(hosts) > 1:
        seg = total if whole == "all_reduce" else len(hosts[0]) * count
        stages.append((whole, ring_tier(topo), (GroupSlice(leaders, 0, seg),)))
        if shared:
            stages.append(("broadcast", "host", tuple(GroupSlice(h, 0, total) for h in hosts)))
    # the leaders' step runs the transport's own collective even for an op in ring_ops (that rule is about
    # gloo's bandwidth at large sizes): at these sizes UCX's is Bruck's all-gather, ceil(log2 H) messages
    # where the ring takes H - 1 (emulated 4x2 at 1 Gbit/s, 32 B all_gather: 115 us for the leaders' ring)
    steps = tuple(Step(i, 0, op, step_impl(op, tier, [g.ranks for g in groups], ring_ops if tier == "host" else (),
                                           host_impl), tier, groups)
                  for i, (op, tier, groups) in enumerate(stages))
    return Plan(collective, "leaders", world, count, layout, steps, max(len(steps), 1),
                meta={"hosts": [len(h) for h in hosts], "leaders": list(leaders)})


def leaders_max_bytes(topo: Topology, collective: str = "all_reduce") -> int:
    """The largest call (nccl-tests' size) auto considers `leaders` for on topo: LEADERS_MAX_BYTES's time on a
    200 Mbit/s NIC, on topo's NIC, between LEADERS_MAX_BYTES and LEADERS_MOST_BYTES; reduce_scatter, whose
    leaders move the whole input (twice HO-Ring's bytes), LEADERS_MAX_BYTES (emulated 2x4 at 1 Gbit/s, 64 KiB:
    559 us against HO-Ring's 319; all_gather 310 against 345, all_reduce level)."""
    if collective == "reduce_scatter":
        return LEADERS_MAX_BYTES
    at_200mbit = LEADERS_MAX_BYTES / 25e6
    return int(min(LEADERS_MOST_BYTES, max(LEADERS_MAX_BYTES, topo.links.nic.bandwidth * at_200mbit)))
