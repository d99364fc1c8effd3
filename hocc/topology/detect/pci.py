"""GPU-to-NIC affinity from PCI paths: each GPU sends through the NIC whose
sysfs device path shares the longest prefix with its own (same PCIe switch
before same root complex before same machine), as NCCL pairs them. Ties go
to the NIC the fewest GPUs have taken yet, so equally near NICs are shared
evenly."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def device_path(pci: str, root: str | Path = "/") -> list[str] | None:
    """The chain of PCI nodes from the root complex down to device `pci`."""
    link = Path(root) / "sys" / "bus" / "pci" / "devices" / pci
    if not link.exists():
        return None
    parts = os.path.realpath(link).split(os.sep)
    return [p for p in parts if p.startswith("pci") or ":" in p]


def shared_prefix(a: list[str], b: list[str]) -> int:
    """How many leading PCI path elements two devices share (more: closer)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def nearest_nics(gpu_pcis: Sequence[str | None], nic_pcis: Sequence[str | None],
                 root: str | Path = "/") -> list[int] | None:
    """For each GPU the index of its nearest NIC, or None when a GPU's or a
    NIC's PCI path cannot be seen."""
    gpus = [device_path(p, root) if p else None for p in gpu_pcis]
    nics = [device_path(p, root) if p else None for p in nic_pcis]
    if not nics or any(g is None for g in gpus) or any(n is None for n in nics):
        return None
    return assign_nearest([g or [] for g in gpus], [n or [] for n in nics])


def assign_nearest(gpus: Sequence[list[str]], nics: Sequence[list[str]]) -> list[int]:
    """Each GPU's NIC by longest shared PCI path; ties go to the NIC with fewer
    GPUs so far (spread evenly), then the lower index."""
    taken = [0] * len(nics)
    out = []
    for g in gpus:
        best = max(range(len(nics)), key=lambda i: (shared_prefix(g, nics[i]), -taken[i], -i))
        taken[best] += 1
        out.append(best)
    return out
