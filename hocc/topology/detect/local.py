"""What one host can see of itself, as a JSON-able report each rank makes
and the ranks exchange (hocc.topology.detect.reports builds the Topology).

A report: {"hostname", "gpus": [PCI address or None, ...] (CUDA order),
"device": the GPU index this rank uses (None: unknown), "nics": [{"name",
"rate" (bytes/s), "pci", "kind"}], "gpu_nic": each GPU's NIC index (None:
unseen), "nvswitch": bool or None, "sources": which detector saw what,
"unseen": what no detector could see}.

Detectors, in order of trust: an NCCL topology dump (NCCL_TOPO_DUMP_FILE:
what NCCL sees) for everything it holds; else GPUs from CUDA (the procfs
list without a driver), NICs and rates from /sys, NVLink from NVML (else
`nvidia-smi topo -m`), GPU-to-NIC affinity from PCI paths (else nvidia-smi's
matrix).
"""

from __future__ import annotations

import functools
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hocc.topology.detect import cuda, nccl_xml, nvml, nvsmi, pci, sysfs


def detect_local(root: str | Path = "/", device: int | None = None, env: Mapping[str, str] | None = None,
                 nccl_dump: str | Path | None = None, topo_text: str | None = None,
                 use_nvml: bool = True, hostname: str | None = None) -> dict[str, Any]:
    """This host's report. `root` is where /sys and /proc are (a fixture in
    tests); `nccl_dump` an NCCL topology XML (default: $NCCL_TOPO_DUMP_FILE if
    that file exists); `topo_text` the output of `nvidia-smi topo -m`
    (default: run it when on the real machine)."""
    env = env if env is not None else os.environ
    real = str(root) == "/"
    report: dict[str, Any] = {"hostname": hostname or socket.gethostname(), "device": device, "gpus": None,
                              "nics": [], "gpu_nic": None, "nvswitch": None, "sources": {}, "unseen": []}
    dump = nccl_dump if nccl_dump is not None else env.get("NCCL_TOPO_DUMP_FILE")
    if dump and Path(dump).is_file():
        seen = nccl_xml.read_dump(dump)
        report.update(gpus=seen["gpus"], nics=seen["nics"], gpu_nic=seen["gpu_nic"], nvswitch=seen["nvswitch"])
        report["sources"] = dict.fromkeys(("gpus", "nics", "affinity", "nvlink"), "nccl-xml")
        _note_unseen(report)
        return report

    gpus, where = cuda.detect_gpus(root, env, use_driver=real)
    report["gpus"] = gpus
    if where:
        report["sources"]["gpus"] = where
    report["nics"] = sysfs.detect_nics(root)
    if report["nics"]:
        report["sources"]["nics"] = "sysfs"

    fabric = nvml.nvlink_fabric() if use_nvml and real else None
    matrix = None
    if topo_text is None and real:
        topo_text = nvsmi.run_topo()
    if topo_text:
        matrix = nvsmi.parse_topo(topo_text)
    if fabric is not None:
        report["nvswitch"], report["sources"]["nvlink"] = fabric["nvswitch"], "nvml"
    elif matrix is not None:
        report["nvswitch"], report["sources"]["nvlink"] = matrix.nvswitch, "nvidia-smi"
    if report["gpus"] is None and matrix is not None:
        report["gpus"], report["sources"]["gpus"] = [None] * matrix.gpus, "nvidia-smi"

    if report["gpus"] and report["nics"]:
        near = pci.nearest_nics(report["gpus"], [n["pci"] for n in report["nics"]], root)
        if near is not None:
            report["gpu_nic"], report["sources"]["affinity"] = near, "pci"
        elif matrix is not None and matrix.nics:
            names = [n["name"] for n in report["nics"]]
            picks = matrix.nearest_nics()
            if picks is not None and all(matrix.nics[j] in names for j in picks):
                report["gpu_nic"] = [names.index(matrix.nics[j]) for j in picks]
                report["sources"]["affinity"] = "nvidia-smi"
    _note_unseen(report)
    return report


@functools.lru_cache(maxsize=1)
def _this_host() -> str:
    return json.dumps(detect_local())


def host_report(device: int | None = None) -> dict[str, Any]:
    """This host's report for a rank using CUDA device `device`: detected
    once per process (it may run nvidia-smi), a fresh copy per call."""
    report: dict[str, Any] = json.loads(_this_host())
    report["device"] = device
    return report


def _note_unseen(report: dict[str, Any]) -> None:
    unseen = []
    if not report["gpus"]:
        unseen.append("GPUs")
    if not report["nics"]:
        unseen.append("NICs")
    elif any(not n.get("rate") for n in report["nics"]):
        unseen.append("NIC rates")
    if report["gpus"] and report["nics"] and report["gpu_nic"] is None:
        unseen.append("GPU-to-NIC affinity")
    if report["gpus"] and len(report["gpus"]) > 1 and report["nvswitch"] is None:
        unseen.append("NVLink")
    report["unseen"] = unseen
