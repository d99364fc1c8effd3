"""Detecting a GPU host's topology: GPUs (CUDA / procfs), NVLink (NVML,
`nvidia-smi topo -m`), NICs and rates (/sys), GPU-to-NIC affinity (PCI
paths), or all of it from an NCCL topology dump. Each rank calls
`detect_local()`; the job's Topology is `from_host_reports(hostnames,
reports)`. No torch, no CUDA import (the CUDA driver is loaded with ctypes,
only when asked, only on the real machine)."""

from hocc.topology.detect.local import detect_local, host_report
from hocc.topology.detect.reports import from_host_reports

__all__ = ["detect_local", "from_host_reports", "host_report"]
