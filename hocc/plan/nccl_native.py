"""What NCCL runs for a whole group's collective, and how long it takes.

hocc's `native` on GPUs is NCCL's own collective, and NCCL does not run one
ring in rank order: it picks, per call, the algorithm and protocol its own
model predicts fastest. This module prices the same choices on hocc's
topology (an independent model written for hocc; NCCL's src/graph/tuning.cc
was read for which algorithms exist where, not copied):

  ring   (all ops) one ring per channel, channels spread over all of a host's
         NICs: each host's ring crossings carry the bus bytes, 2(W-1)/W * S
         for all_reduce and (W-1)/W * S for the others, split over its NICs;
         every rank's host-tier link carries (G-1)/G of them (all of them on
         one host). Latency: the ring's hops, each at its tier's latency.
  tree   (all_reduce over >1 host) a chain through each host's GPUs and a
         double binary tree across hosts: each GPU's host-tier link carries
         the data up and down (2 S); across hosts see `tree_net_bytes`;
         latency 2(G-1) host hops and 2 log2(N) network hops.
  nvls   (all_reduce, NVSwitch hosts) NVLink SHARP inside a host, the switch
         reducing: S at `nvls_efficiency` of the host-tier rate; over several
         hosts combined with the tree across them (NCCL's NVLS tree).

Protocols scale each algorithm's latency and bandwidth (PROTOCOLS): NCCL's
low-latency protocols trade bandwidth (flags in every line) for latency; NVLS
runs only the simple protocol. The simple protocol also pays its pipeline's
fill (`pipeline_fill`): what makes measured busbw ramp up to 1 GiB and more
where a plain alpha-beta model reaches its bound at a few MiB. The prediction
is the fastest combination, as NCCL's tuner picks it; a call also pays one
`launch` (NCCL's base latency). Closed forms over a summary of the topology,
so 4096 ranks cost the same as 8 and the calibration can evaluate it
thousands of times. The same forms price each of HO-Ring's NCCL calls on its
sub-communicator (`call_seconds`, from hocc.plan.cost), so both sides pay alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hocc.plan.memo import memo
from hocc.plan.volumes import bus_factor, call_bytes
from hocc.topology import Topology
from hocc.topology.links import LinkModel

if TYPE_CHECKING:  # hocc.plan.cost prices HO-Ring's NCCL calls with this module
    from hocc.plan.cost import CostParams

PROTOCOLS: dict[str, tuple[float, float]] = {"simple": (1.0, 1.0), "ll128": (0.5, 0.9), "ll": (0.25, 0.45)}
"""protocol -> (latency factor, bandwidth factor) against the simple protocol:
LL sends 8-byte lines half of which are flags, LL128 128-byte lines with 8
bytes of flags; both skip the simple protocol's per-chunk handshakes."""

HANDSHAKE = {"simple": 2.0, "ll128": 1.0, "ll": 1.0}
"""Network latencies per hop by protocol: the simple protocol's sender waits
for the receiver's credit before each step (a round trip); LL and LL128 carry
their flags in the data and pay the one-way latency only."""



@dataclass(frozen=True)
class Summary:
    """What the closed forms need about a communicator: W ranks, N hosts of up
    to G ranks, the fewest NICs its ranks use on any host, M switches, whether
    every host has an NVSwitch, and channel_share: the share of its hosts' NICs
    it uses. NCCL opens channels (each with its own buffers) in proportion to
    the network paths it drives, so a rail's communicator on one of a host's
    8 NICs keeps about 1/8 of a whole-host communicator's pipeline window in
    flight (1 for a whole world, and for a one-host communicator on NVLink)."""

    world: int
    hosts: int
    per_host: int
    nics: int
    switches: int
    nvswitch: bool
    channel_share: float = 1.0


def summarize(topo: Topology) -> Summary:
    def make() -> Summary:
        infos = topo.host_infos()
        return Summary(topo.world_size, len(infos), max(len(h.ranks) for h in infos),
                       min(h.nics for h in infos), len({h.switch for h in infos}),
                       all(h.fabric == "nvswitch" for h in infos))

    return memo(topo, "nccl_summary", make)


def tree_net_bytes(hosts: int, s: float) -> float:
    """Bytes the busiest host sends (and receives) over its NICs in a double
    binary tree all-reduce of S. Each tree carries S/2 up and down. On 2 hosts
    each host has one peer: S in all. On more, each host is an inner node of
    one tree (a parent and two children: 3 * S/2) and a leaf of the other (S/2):
    2 S, as much as a ring, so the tree's (and NVLS tree's) 2-host gain over
    rings is gone from 3 hosts on (nccl-tests#309: 8x400G H100 hosts reach
    ~470 GB/s busbw on 2 hosts, 320-365 on 4 and 8)."""
    if hosts < 2:
        return 0.0
    return s if hosts == 2 else 2.0 * s


def pipeline_fill(stages: int, bandwidth_time: float, s: float, window: float, proto: str = "simple") -> float:
    """Seconds a pipeline of `stages` stages takes to fill: a window per stage
    (`window`, CostParams.pipeline_window, scaled for the low-latency protocols' smaller buffers by
    their latency factor; never more than S) at the algorithm's own rate,
    S / bandwidth_time. A message smaller than the window crosses the stages
    store-and-forward."""
    if s <= 0 or stages <= 0 or window <= 0:
        return 0.0
    return stages * min(window * PROTOCOLS[proto][0], s) * bandwidth_time / s


def options(collective: str, topo: Topology, count: int, elem_size: int, params: CostParams,
            links: LinkModel | None = None) -> dict[str, float]:
    """Predicted seconds of every algorithm/protocol NCCL could run ('ring/simple', ...)."""
    return communicator_options(collective, summarize(topo), count, elem_size, params, links or topo.links)


def call_seconds(collective: str, sm: Summary, count: float, elem_size: int, params: CostParams,
                 links: LinkModel) -> float:
    """One NCCL call on the communicator `sm` describes, at NCCL's pick: what
    hocc.plan.cost charges each of HO-Ring's native steps when it prices NCCL."""
    return min(communicator_options(collective, sm, count, elem_size, params, links).values())


def communicator_options(collective: str, sm: Summary, count: float, elem_size: int, params: CostParams,
                         links: LinkModel) -> dict[str, float]:
    """`options` for any communicator (a whole topology, or one of HO-Ring's sub-groups)."""
    w, n, g, m = sm.world, sm.hosts, sm.per_host, sm.switches
    s = call_bytes(collective, count, elem_size, w)
    if w < 2 or s == 0:
        return {"ring/simple": params.launch}
    bh = links.host.bandwidth * params.host_efficiency
    bn = links.nic.bandwidth * params.nic_efficiency * sm.nics
    bt = links.trunk.bandwidth * params.nic_efficiency
    lh, ln, lt = links.host.latency, links.nic.latency, links.trunk.latency
    out: dict[str, float] = {}

    # ring: bandwidth term, latency per lap of W edges
    bus = bus_factor(collective, w) * s
    if n == 1:
        ring_bw = bus / bh if sm.nvswitch else bus * w / bh
    else:
        host_part = bus * (g - 1) / g / bh if sm.nvswitch else bus * (g - 1) / bh
        ring_bw = max(host_part, bus / bn, bus / bt if m > 1 else 0.0)
    inter_host = n if n > 1 else 0
    inter_switch = m if m > 1 else 0
    host_lap = (w - inter_host) * lh  # the protocols' handshakes scale these, not the network's own latency
    net_lap = (inter_host - inter_switch) * ln + inter_switch * lt
    hops = (2 if collective == "all_reduce" else 1) * (w - 1)
    ring_stages = 2 if collective == "all_reduce" else 1  # reduce-scatter and all-gather laps
    window = params.pipeline_window * sm.channel_share
    for proto, (fl, fb) in PROTOCOLS.items():
        fill = pipeline_fill(ring_stages, ring_bw / fb, s, window, proto)
        ring_lat = hops / w * (host_lap * fl + net_lap * HANDSHAKE[proto])
        out[f"ring/{proto}"] = params.launch + ring_lat + ring_bw / fb + fill
    if collective != "all_reduce" or (n == 1 and not sm.nvswitch):
        return out

    depth = math.ceil(math.log2(n)) if n > 1 else 0
    net = tree_net_bytes(n, s)
    net_bw = max(net / bn, net * (m - 1) / m / bt * 2 if m > 1 else 0.0) if n > 1 else 0.0
    net_lat = 2 * depth * (lt if m > 1 else ln)
    stages = 2 + 2 * depth  # into the host's chain or switch, up the tree, down it, out again
    if n > 1:  # tree: chain in the host, double binary tree across hosts
        chain = 2.0 * s / bh if sm.nvswitch else 2.0 * s * (g - 1) / bh
        tree_bw = max(chain if g > 1 else 0.0, net_bw)
        for proto, (fl, fb) in PROTOCOLS.items():
            fill = pipeline_fill(stages, tree_bw / fb, s, window, proto)
            tree_lat = 2 * (g - 1) * lh * fl + net_lat * HANDSHAKE[proto]
            out[f"tree/{proto}"] = params.launch + tree_lat + tree_bw / fb + fill
    if sm.nvswitch and g > 1 and params.nvls_efficiency > 0:  # NVLink SHARP (simple protocol only; H100 on)
        nvls_bw = max(s / (params.nvls_efficiency * links.host.bandwidth), net_bw)
        fill = pipeline_fill(stages, nvls_bw, s, window)
        out["nvls/simple"] = params.launch + 2 * lh + net_lat * HANDSHAKE["simple"] + nvls_bw + fill
    return out


def predict_nccl(collective: str, topo: Topology, count: int, elem_size: int, params: CostParams,
                 links: LinkModel | None = None) -> tuple[str, float]:
    """NCCL's pick ('algo/protocol') and its predicted seconds."""
    opts = options(collective, topo, count, elem_size, params, links)
    best = min(opts, key=opts.__getitem__)
    return best, opts[best]
