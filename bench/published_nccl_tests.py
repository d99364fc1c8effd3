"""Published nccl-tests figures (busbw, GB/s) the GPU cost model is checked
against, each with the public source it was read from. Only figures found
in those sources; none is made up or adjusted. Used by bench/gpu_report.py.

Spec strings describe each cluster as hocc's topology specs do (per-GPU
NVLink rate per direction as host=, each NIC's line rate as nic=); `over`
names what the hardware lacks (A100 and earlier have no NVLink SHARP).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1 << 20
GIB = 1 << 30

H100 = "fabric=nvswitch,host=450GB"  # NVLink 4: 18 links, 450 GB/s per direction
H800 = "fabric=nvswitch,host=200GB"  # H800: 8 NVLink 4 links, 200 GB/s per direction
A100 = "fabric=nvswitch,host=300GB"  # NVLink 3: 12 links, 300 GB/s per direction
NO_NVLS = {"nvls_efficiency": 0.0}


@dataclass(frozen=True)
class Figure:
    source: str
    cluster: str
    spec: str
    op: str
    size: int
    busbw: float
    over: dict[str, float] = field(default_factory=dict)
    transport: str = "IB"
    note: str = ""


AWS = ("aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md "
       "(all_reduce_perf logs, 2x p4de.24xlarge and 2x p5.48xlarge)")
A3 = "lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result (all_reduce_perf log, 2 GCP A3 Mega VMs)"
OCI = ("oracle-japan/ocitutorials, tutorial 'NCCL Tests実行方法 (BM.GPU.H100.8編)' "
       "(all_reduce_perf log, 2 OCI BM.GPU.H100.8, NCCL 2.21.5)")

FIGURES: list[Figure] = [
    # AWS p5.48xlarge: 8 H100, 32 EFA NICs of 100 Gbit/s
    Figure(AWS, "2 x p5.48xlarge (8 H100, 32 x 100G EFA)", f"2x8@nics=32,nic=100gbit,{H100}", "all_reduce",
           8 * GIB, 479.28, transport="EFA"),
    Figure(AWS, "2 x p5.48xlarge (8 H100, 32 x 100G EFA)", f"2x8@nics=32,nic=100gbit,{H100}", "all_reduce",
           1 * GIB, 436.95, transport="EFA"),
    Figure(AWS, "2 x p5.48xlarge (8 H100, 32 x 100G EFA)", f"2x8@nics=32,nic=100gbit,{H100}", "all_reduce",
           64 * MIB, 209.19, transport="EFA"),
    Figure(AWS, "2 x p5.48xlarge (8 H100, 32 x 100G EFA)", f"2x8@nics=32,nic=100gbit,{H100}", "all_reduce",
           1 * MIB, 15.95, transport="EFA"),
    Figure(AWS, "2 x p5.48xlarge (8 H100, 32 x 100G EFA)", f"2x8@nics=32,nic=100gbit,{H100}", "all_reduce",
           256 << 10, 3.84, transport="EFA"),
    # AWS p4de.24xlarge: 8 A100 80GB, 4 EFA NICs of 100 Gbit/s
    Figure(AWS, "2 x p4de.24xlarge (8 A100, 4 x 100G EFA)", f"2x8@nics=4,nic=100gbit,{A100}", "all_reduce",
           2 * GIB, 78.33, NO_NVLS, transport="EFA"),
    Figure(AWS, "2 x p4de.24xlarge (8 A100, 4 x 100G EFA)", f"2x8@nics=4,nic=100gbit,{A100}", "all_reduce",
           64 * MIB, 47.58, NO_NVLS, transport="EFA"),
    Figure(AWS, "2 x p4de.24xlarge (8 A100, 4 x 100G EFA)", f"2x8@nics=4,nic=100gbit,{A100}", "all_reduce",
           1 * MIB, 6.35, NO_NVLS, transport="EFA"),
    # GCP A3 Mega: 8 H100, 8 NICs of 200 Gbit/s (GPUDirect-TCPXO)
    Figure(A3, "2 x A3 Mega (8 H100, 8 x 200G TCPXO)", f"2x8@nics=8,nic=200gbit,{H100}", "all_reduce",
           8 * GIB, 338.82, transport="TCPXO"),
    Figure(A3, "2 x A3 Mega (8 H100, 8 x 200G TCPXO)", f"2x8@nics=8,nic=200gbit,{H100}", "all_reduce",
           1 * GIB, 297.86, transport="TCPXO"),
    Figure(A3, "2 x A3 Mega (8 H100, 8 x 200G TCPXO)", f"2x8@nics=8,nic=200gbit,{H100}", "all_reduce",
           64 * MIB, 99.74, transport="TCPXO"),
    Figure(A3, "2 x A3 Mega (8 H100, 8 x 200G TCPXO)", f"2x8@nics=8,nic=200gbit,{H100}", "all_reduce",
           1 * MIB, 9.68, transport="TCPXO"),
    # OCI BM.GPU.H100.8: 8 H100, 16 RoCE ports of 200 Gbit/s
    Figure(OCI, "2 x BM.GPU.H100.8 (8 H100, 16 x 200G RoCE)", f"2x8@nics=16,nic=200gbit,{H100}", "all_reduce",
           8 * GIB, 463.90, transport="RoCE"),
    Figure(OCI, "2 x BM.GPU.H100.8 (8 H100, 16 x 200G RoCE)", f"2x8@nics=16,nic=200gbit,{H100}", "all_reduce",
           1 * GIB, 446.28, transport="RoCE"),
    # figures stated in nccl-tests issue threads
    Figure("github.com/NVIDIA/nccl-tests/issues/100 (2 HGX A100, four 200 Gbit/s ConnectX-6: '91GB/s in busbw', "
           "-b 1G -e 8G)", "2 x HGX A100 (4 x 200G IB)", f"2x8@nics=4,nic=200gbit,{A100}", "all_reduce",
           8 * GIB, 91.0, NO_NVLS, note="stated peak over 1-8 GiB"),
    Figure("github.com/NVIDIA/nccl-tests/issues/175 (A100 x 8, 4 x 200 Gbit IB: two nodes 'only 86GB/s')",
           "2 x 8 A100 (4 x 200G IB)", f"2x8@nics=4,nic=200gbit,{A100}", "all_reduce", 4 * GIB, 86.0, NO_NVLS,
           note="stated, -e 4G"),
    Figure("github.com/NVIDIA/nccl-tests/issues/175 (single node, -g 8 -e 4G: '232.54GB/s')",
           "1 x 8 A100 (NVSwitch)", A100.replace("fabric", "8@fabric"), "all_reduce", 4 * GIB, 232.54, NO_NVLS,
           transport="-", note="stated, -e 4G"),
    Figure("github.com/NVIDIA/nccl-tests/issues/119 (3 servers x 8 A100 SXM4, 4 HDR cards: 'peak performance "
           "reaches about 96GB/s', -e 128M)", "3 x 8 A100 (4 x 200G HDR IB)", f"3x8@nics=4,nic=200gbit,{A100}",
           "all_reduce", 128 * MIB, 96.0, NO_NVLS, note="stated peak, sizes up to 128 MiB"),
    Figure("github.com/NVIDIA/nccl-tests/issues/153 (two H800 servers, 8 x 100 Gbps ConnectX-6 each: busbw "
           "'as high as 161', NVLS)", "2 x 8 H800 (8 x 100G IB)", f"2x8@nics=8,nic=100gbit,{H800}", "all_reduce",
           8 * GIB, 161.0, note="stated peak; the thread writes 'Gbps', nccl-tests prints GB/s: read as GB/s"),
]

DEFAULTS_FROM = [
    "github.com/NVIDIA/nccl-tests/issues/212 (NVIDIA: 450 GB/s NVLink line rate, ~370 GB/s effective; "
    "~480 GB/s busBw, ~275 GB/s algbw with NVLink SHARP on 8 H100)",
    "github.com/NVIDIA/nccl-tests/issues/290 (NVIDIA: 46-48 GB/s per NDR 400 Gbit/s NIC)",
]
"""The figures hocc.plan.nccl_defaults took its efficiencies from: not
counted in the comparison (they would check the model against itself)."""
