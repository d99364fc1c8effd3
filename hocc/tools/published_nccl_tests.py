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

I309 = "github.com/NVIDIA/nccl-tests/issues/309"
GJ = (f"{I309} (comments by gj-aion, 2025-06-18: all_reduce_perf -b 1M -e 8G on 2, 4 and all 8 nodes of one "
      "8-node H100 cluster, 400G InfiniBand, default NCCL settings)")
GJ_CLUSTER = "gj-aion's 8 x H100 (8 x 400G IB)"
QV = (f"{I309} (comment by qoofyk, 2025-05-23: all_reduce_perf -b 8 -e 16g on 4 H100 VMs, 32 GPU-NIC pairs, "
      "CX-7 400G IB, NCCL 2.26.2)")
IB400 = f"nics=8,nic=400gbit,{H100}"


def _log(source: str, cluster: str, hosts: int, rows: list[tuple[int, float]]) -> list[Figure]:
    """Rows of one all_reduce_perf log (out-of-place busbw), at the sizes every log here is read at:
    1 MiB, 64 MiB, 128 MiB, 1 GiB, 8 GiB."""
    return [Figure(source, cluster, f"{hosts}x8@{IB400}", "all_reduce", size, busbw) for size, busbw in rows]


LOG_SIZES = (1 * MIB, 64 * MIB, 128 * MIB, 1 * GIB, 8 * GIB)

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
    *_log(GJ, GJ_CLUSTER, 2, list(zip(LOG_SIZES, (21.08, 263.66, 335.25, 447.65, 466.73), strict=True))),
    *_log(GJ, GJ_CLUSTER, 4, list(zip(LOG_SIZES, (6.41, 208.34, 246.41, 322.02, 324.52), strict=True))),
    *_log(GJ, GJ_CLUSTER, 8, list(zip(LOG_SIZES, (17.64, 184.00, 227.97, 286.81, 320.70), strict=True))),
    *_log(QV, "qoofyk's 4 H100 VMs (8 x 400G IB)", 4,
          list(zip(LOG_SIZES, (24.73, 224.53, 262.48, 358.14, 364.93), strict=True))),
]

CALIBRATION_CLUSTER = GJ_CLUSTER
"""A cluster with published 2, 4 and 8 node logs: bench/gpu_report.py fits the
model to its 2-node rows only and predicts the others."""

DEFAULTS_FROM = [
    "github.com/NVIDIA/nccl-tests/issues/212 (NVIDIA: 450 GB/s NVLink line rate, ~370 GB/s effective; "
    "~480 GB/s busBw, ~275 GB/s algbw with NVLink SHARP on 8 H100)",
    "github.com/NVIDIA/nccl-tests/issues/290 (NVIDIA: 46-48 GB/s per NDR 400 Gbit/s NIC)",
    f"{I309} (qoofyk's 2 x Dell XE9680, 8 H100 and 8 x 400G IB each, NCCL 2.26.2: 25 us for 8 B, time "
    "against size from 64 MiB to 8 GiB about 210 us + S / 250 GB/s; 1 MiB 27.33, 64 MiB 269.98, 1 GiB "
    "448.90, 8 GiB 468.46 GB/s busbw): the InfiniBand hop latency and the pipeline window",
    "aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md (2x p5.48xlarge, 65-75 us "
    "for 8 B) and lessizzmore/create-a3mega-ztan-fork ztan-NCCL-test-result (2 A3 Mega, 123 us for 8 B): "
    "the EFA and TCPXO hop latencies (those logs' 1 MiB and larger rows stay rows)",
]
"""The figures hocc.plan.nccl_defaults and hocc.plan.nccl_native took their
defaults from: not counted in the comparison (they would check the model
against itself)."""
