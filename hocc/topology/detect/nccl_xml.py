"""NCCL's topology dump (NCCL_TOPO_DUMP_FILE): GPUs, NICs with their speed,
NVLinks, and which NIC sits under the same PCIe switch as each GPU. Users of
NCCL have this file (NCCL writes it at init when the variable is set); it
describes what NCCL itself sees."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from hocc.topology.detect.pci import assign_nearest

NVSWITCH_CLASS = "0x068000"  # an NVLink whose far end is this PCI class is an NVSwitch


def read_dump(path: str | Path) -> dict[str, Any]:
    """{"gpus": [PCI...] by CUDA index, "nics": [NIC...], "gpu_nic": [...], "nvswitch": bool}."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise ValueError(f"{path}: not an NCCL topology XML ({e})") from None
    if root.tag != "system":
        raise ValueError(f"{path}: an NCCL topology dump starts with <system>, this one with <{root.tag}>")
    gpus: list[tuple[int, str, list[str], list[ET.Element]]] = []  # (dev, busid, ancestors, nvlinks)
    nics: list[tuple[dict[str, Any], list[str]]] = []

    def walk(node: ET.Element, chain: list[str]) -> None:
        for child in node:
            if child.tag == "pci":
                walk(child, [*chain, child.get("busid", "").lower()])
            elif child.tag == "cpu":
                walk(child, [*chain, f"numa{child.get('numaid', '?')}"])
            elif child.tag == "gpu":
                gpus.append((int(child.get("dev", len(gpus))), chain[-1], chain[:-1], child.findall("nvlink")))
            elif child.tag == "nic":
                for net in child.findall("net"):
                    mbit = float(net.get("speed", "0") or 0)
                    nics.append(({"name": net.get("name", f"net{len(nics)}"), "rate": mbit * 1e6 / 8,
                                  "pci": chain[-1] if chain else None, "kind": "ib"}, chain[:-1]))
            else:
                walk(child, chain)

    walk(root, [])
    gpus.sort()

    gpu_nic = assign_nearest([chain for _, _, chain, _ in gpus], [n[1] for n in nics]) if nics else None
    switched = bool(gpus) and len(gpus) > 1 and all(
        links and all(link.get("tclass") == NVSWITCH_CLASS for link in links) for _, _, _, links in gpus)
    return {"gpus": [g[1] for g in gpus], "nics": [n for n, _ in nics], "gpu_nic": gpu_nic, "nvswitch": switched,
            "nvlinks": [sum(int(link.get("count", "1")) for link in g[3]) for g in gpus]}
