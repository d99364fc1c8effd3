"""`host_rails`: the all-reduce of small buffers in two latency steps, where
HO-Ring takes three (docs/algorithms.md, "Small calls").

  stage 0  every host all-reduces the whole buffer among its ranks (shared
           memory on CPU: one barrier for a few KiB, csrc/transport/shm.h)
  stage 1  every rail (the ranks of one local index, one per host)
           all-reduces the whole buffer across the hosts

After stage 0 every rank of a host holds its host's sum, so each rail sums
the hosts' sums and every rank ends with the total: no broadcast back down.
HO-Ring cuts the buffer among a host's G ranks and needs a host all-gather at
the end; here each rail carries the whole buffer, so a host's NIC carries G
times HO-Ring's bytes. That is the trade: one step (a barrier's wake-ups, a
launch) against (G-1) x the bytes, which wins only for small buffers; the
cost model prices both and auto picks by size.

Hosts must be of one size (every rank on exactly one rail); elsewhere the
planner runs ho_ring. Only all_reduce: HO-Ring's reduce-scatter and
all-gather already take two steps.
"""

from __future__ import annotations

from hocc.plan.ho_ring.stages import step_impl
from hocc.plan.ring import ring_tier
from hocc.plan.types import GroupSlice, Layout, Plan, Step
from hocc.topology import Topology

CANNOT = "it runs only all_reduce, on hosts of one size (every rank on exactly one rail)"


def build_host_rails(collective: str, topo: Topology, count: int, ring_ops: tuple[str, ...] = (),
                     host_impl: str = "") -> Plan | None:
    """The two-step plan, or None where it cannot run (CANNOT)."""
    hosts = topo.host_groups()
    if collective != "all_reduce" or len({len(h) for h in hosts}) != 1:
        return None
    stages: list[tuple[str, tuple[tuple[int, ...], ...]]] = []
    if len(hosts[0]) > 1:
        stages.append(("host", tuple(hosts)))
    if len(hosts) > 1:
        stages.append((ring_tier(topo), tuple(tuple(h[j] for h in hosts) for j in range(len(hosts[0])))))
    steps = tuple(Step(i, 0, "all_reduce", step_impl("all_reduce", tier, groups, ring_ops, host_impl), tier,
                       tuple(GroupSlice(g, 0, count) for g in groups))
                  for i, (tier, groups) in enumerate(stages))
    return Plan("all_reduce", "host_rails", topo.world_size, count, Layout(1, count, 1, count, (0,)), steps,
                max(len(steps), 1), meta={"hosts": [len(h) for h in hosts]})
