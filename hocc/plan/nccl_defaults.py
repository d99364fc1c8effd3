"""GPU-cluster defaults for the cost model, from public measurements (not
from the CPU testbed): what `hocc plan --backend nccl` assumes when no
calibrated file says otherwise. `hocc calibrate` refits all of them from
nccl-tests logs.

Efficiencies (share of a link's line rate that NCCL traffic gets):
  NIC 0.94: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA,
      github.com/NVIDIA/nccl-tests/issues/290): 47 of 50 GB/s.
  NVLink 0.82: "450GB/s is the line rate. With the protocol overhead (~20%)
      NCCL can get an effective NVLink bandwidth of 370GB/s" (NVIDIA,
      github.com/NVIDIA/nccl-tests/issues/212).
  NVLS 0.61: on 8 H100 "a peak busBw of ~480GB/s (algbw ~275GB/s)" with NVLink
      SHARP (same thread): 275 of 450 GB/s.
Latencies are per hop of NCCL's simple protocol (the low-latency protocols
scale them, hocc.plan.nccl_native.PROTOCOLS), and `launch` is a call's base
cost; their orders of magnitude follow NCCL's published small-message
results (a few us per NVLink hop, several per network hop, ~10 us for the
smallest all-reduce on one host) and are checked in
bench/results/nccl-tests-compare.md.
"""

from __future__ import annotations

from dataclasses import replace

from hocc.plan.cost import CostParams
from hocc.topology.links import Link, LinkModel

NCCL_PARAMS = CostParams(launch=8e-6, ring_step=5e-6, copy_bandwidth=1e12, host_efficiency=0.82,
                         nic_efficiency=0.94, native="nccl", nvls_efficiency=0.61, pipeline_window=12 << 20,
                         host_message=0.0)
"""launch: a call's base latency; ring_step: hocc's own p2p ring hop (a kernel
per hop); copies at device memory speed (1 TB/s). pipeline_window: bytes NCCL's
simple protocol keeps in flight per pipeline stage, summed over its channels;
a collective of S through k stages then takes about (1 + k * window / S) times
its bandwidth time. 12 MiB is read off a 2-host 8x400G H100 log (nccl-tests#309,
qoofyk: time against size from 64 MiB up is about 210 us + S / 250 GB/s, and
210 us at 250 GB/s over an NVLS tree's 4 stages is 13 MB a stage). HO-Ring's
calls on sub-communicators pay it too, in proportion to the NICs they drive
(hocc.plan.nccl_native.Summary.channel_share)."""

NCCL_LINKS = LinkModel(host=Link(450e9, 2e-6), nic=Link(400e9 / 8, 8e-6), trunk=Link(400e9 / 8, 10e-6))
"""An H100 host's NVLink (450 GB/s per GPU and direction), a 400 Gbit/s NIC,
and a trunk hop; the trunk's rate is the caller's to set (hocc plan makes it
non-blocking unless told)."""

TRANSPORT_NIC_LATENCY = {"IB": 5e-6, "RoCE": 5e-6, "EFA": 25e-6, "TCPXO": 54e-6}
"""Seconds per network hop by transport, from the smallest all-reduce of a
2-host nccl-tests log, which NCCL runs as a tree with low-latency protocols:
launch (8 us) + its NVLink chain (7 us) + 2 network hops. InfiniBand: 25 us
(nccl-tests#309, 2 HGX H100, 8 B); EFA: 65-75 us (aws-samples/awsome-
distributed-training, micro-benchmarks/nccl-tests/README.md, 2x p5.48xlarge);
GPUDirect-TCPXO: 123 us (lessizzmore/create-a3mega-ztan-fork,
ztan-NCCL-test-result, 2 A3 Mega). RoCE: taken as InfiniBand's (no small-size
log found). A network hop's latency is the transport's and is not shortened
by NCCL's low-latency protocols (hocc.plan.nccl_native)."""


def links_for(transport: str, base: LinkModel = NCCL_LINKS) -> LinkModel:
    """`base` with the NIC hop latency of `transport` ('IB', 'RoCE', 'EFA',
    'TCPXO'); other transports (or none, one host) keep `base`'s."""
    lat = TRANSPORT_NIC_LATENCY.get(transport)
    return base if lat is None else base.with_tier("nic", replace(base.nic, latency=lat))
