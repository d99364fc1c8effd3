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
         the data up and down (2 S), each host's NICs together
         2(N-1)/N * S; latency 2(G-1) host hops and 2 log2(N) network hops.
  nvls   (all_reduce, NVSwitch hosts) NVLink SHARP inside a host, the switch
         reducing: S at `nvls_efficiency` of the host-tier rate; over several
         hosts combined with the tree across them (NCCL's NVLS tree).

Protocols scale each algorithm's latency and bandwidth (PROTOCOLS): NCCL's
low-latency protocols trade bandwidth (flags in every line) for latency; NVLS
runs only the simple protocol. The prediction is the fastest combination, as
NCCL's tuner picks it; a call also pays one `launch` (NCCL's base latency).
Closed forms over a summary of the topology, so 4096 ranks cost the same as 8
and the calibration can evaluate it thousands of times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hocc.plan.cost import CostParams
from hocc.plan.memo import memo
from hocc.topology import Topology
from hocc.topology.links import LinkModel

PROTOCOLS: dict[str, tuple[float, float]] = {"simple": (1.0, 1.0), "ll128": (0.5, 0.9), "ll": (0.25, 0.45)}
"""protocol -> (latency factor, bandwidth factor) against the simple protocol:
LL sends 8-byte lines half of which are flags, LL128 128-byte lines with 8
bytes of flags; both skip the simple protocol's per-chunk handshakes."""


@dataclass(frozen=True)
class Summary:
    """What the closed forms need: W ranks, N hosts of up to G ranks, the
    fewest NICs any host has, M switches, whether every host has an NVSwitch."""

    world: int
    hosts: int
    per_host: int
    nics: int
    switches: int
    nvswitch: bool


def summarize(topo: Topology) -> Summary:
    def make() -> Summary:
        infos = topo.host_infos()
        return Summary(topo.world_size, len(infos), max(len(h.ranks) for h in infos),
                       min(h.nics for h in infos), len({h.switch for h in infos}),
                       all(h.fabric == "nvswitch" for h in infos))

    return memo(topo, "nccl_summary", make)


def _bytes(collective: str, count: int, elem_size: int, world: int) -> float:
    """S, the full buffer: all_reduce's tensor, the others' W blocks."""
    return float(count * elem_size * (1 if collective == "all_reduce" else world))


def options(collective: str, topo: Topology, count: int, elem_size: int, params: CostParams,
            links: LinkModel | None = None) -> dict[str, float]:
    """Predicted seconds of every algorithm/protocol NCCL could run ('ring/simple', ...)."""
    sm = summarize(topo)
    links = links or topo.links
    w, n, g, m = sm.world, sm.hosts, sm.per_host, sm.switches
    s = _bytes(collective, count, elem_size, w)
    if w < 2 or s == 0:
        return {"ring/simple": params.launch}
    bh = links.host.bandwidth * params.host_efficiency
    bn = links.nic.bandwidth * params.nic_efficiency * sm.nics
    bt = links.trunk.bandwidth * params.nic_efficiency
    lh, ln, lt = links.host.latency, links.nic.latency, links.trunk.latency
    out: dict[str, float] = {}

    # ring: bandwidth term, latency per lap of W edges
    bus = (2.0 if collective == "all_reduce" else 1.0) * (w - 1) / w * s
    if n == 1:
        ring_bw = bus / bh if sm.nvswitch else bus * w / bh
    else:
        host_part = bus * (g - 1) / g / bh if sm.nvswitch else bus * (g - 1) / bh
        ring_bw = max(host_part, bus / bn, bus / bt if m > 1 else 0.0)
    inter_host = n if n > 1 else 0
    inter_switch = m if m > 1 else 0
    lap = (w - inter_host) * lh + (inter_host - inter_switch) * ln + inter_switch * lt
    hops = (2 if collective == "all_reduce" else 1) * (w - 1)
    ring_lat = hops / w * lap
    for proto, (fl, fb) in PROTOCOLS.items():
        out[f"ring/{proto}"] = params.launch + ring_lat * fl + ring_bw / fb
    if collective != "all_reduce" or (n == 1 and not sm.nvswitch):
        return out

    depth = math.ceil(math.log2(n)) if n > 1 else 0
    net = 2.0 * (n - 1) / n * s
    net_bw = max(net / bn, 2.0 * (m - 1) / m * s / bt if m > 1 else 0.0) if n > 1 else 0.0
    net_lat = 2 * depth * (lt if m > 1 else ln)
    if n > 1:  # tree: chain in the host, double binary tree across hosts
        chain = 2.0 * s / bh if sm.nvswitch else 2.0 * s * (g - 1) / bh
        tree_bw = max(chain if g > 1 else 0.0, net_bw)
        tree_lat = 2 * (g - 1) * lh + net_lat
        for proto, (fl, fb) in PROTOCOLS.items():
            out[f"tree/{proto}"] = params.launch + tree_lat * fl + tree_bw / fb
    if sm.nvswitch and g > 1 and params.nvls_efficiency > 0:  # NVLink SHARP (simple protocol only; H100 on)
        nvls = s / (params.nvls_efficiency * links.host.bandwidth)
        out["nvls/simple"] = params.launch + 2 * lh + net_lat + max(nvls, net_bw)
    return out


def predict_nccl(collective: str, topo: Topology, count: int, elem_size: int, params: CostParams,
                 links: LinkModel | None = None) -> tuple[str, float]:
    """NCCL's pick ('algo/protocol') and its predicted seconds."""
    opts = options(collective, topo, count, elem_size, params, links)
    best = min(opts, key=opts.__getitem__)
    return best, opts[best]
