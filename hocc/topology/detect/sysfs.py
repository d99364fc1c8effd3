"""NICs and their rates from /sys: RDMA ports (InfiniBand, RoCE) from
/sys/class/infiniband, plain Ethernet from /sys/class/net.

A NIC is {"name", "rate" (bytes/s), "pci" (PCI address), "kind"}: "ib" or
"roce" for RDMA ports (what NCCL uses when there are any), "eth" for the
others. Ports that are not active, interfaces without a PCI device (virtual:
bridges, docker0, lo) and netdevs of an RDMA device (IPoIB, a RoCE port's own
netdev) are left out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

NIC = dict[str, Any]
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pci_of(device_link: Path) -> str | None:
    """The PCI address a sysfs 'device' symlink points at (its last component)."""
    try:
        target = os.path.realpath(device_link)
    except OSError:
        return None
    name = os.path.basename(target)
    return name if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$", name) else None


def rdma_nics(root: str | Path = "/") -> list[NIC]:
    """Active RDMA ports, one NIC per device (its first active port), by name."""
    base = Path(root) / "sys" / "class" / "infiniband"
    out: list[NIC] = []
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir(), key=lambda p: _natural(p.name)):
        ports = dev / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            state = _read(port / "state") or ""
            rate = _RATE.match(_read(port / "rate") or "")
            if "ACTIVE" not in state or not rate:
                continue
            layer = (_read(port / "link_layer") or "InfiniBand").lower()
            out.append({"name": dev.name, "rate": float(rate.group(1)) * 1e9 / 8, "pci": pci_of(dev / "device"),
                        "kind": "ib" if layer == "infiniband" else "roce"})
            break
    return out


def ethernet_nics(root: str | Path = "/", skip_pci: set[str] | None = None) -> list[NIC]:
    """Physical Ethernet interfaces that are up with a known speed, except
    those on a PCI device in `skip_pci` (the RDMA devices' own netdevs)."""
    base = Path(root) / "sys" / "class" / "net"
    out: list[NIC] = []
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir(), key=lambda p: _natural(p.name)):
        pci = pci_of(dev / "device") if (dev / "device").exists() else None
        if pci is None or pci in (skip_pci or set()) or _read(dev / "operstate") != "up":
            continue
        try:
            mbit = int(_read(dev / "speed") or "-1")
        except ValueError:
            continue
        if mbit > 0:
            out.append({"name": dev.name, "rate": mbit * 1e6 / 8, "pci": pci, "kind": "eth"})
    return out


def rdma_pcis(root: str | Path = "/") -> set[str]:
    """PCI addresses of every RDMA device, active or not."""
    base = Path(root) / "sys" / "class" / "infiniband"
    found = (pci_of(d / "device") for d in base.iterdir()) if base.is_dir() else iter(())
    return {p for p in found if p}


def detect_nics(root: str | Path = "/") -> list[NIC]:
    """What NCCL would use: the active RDMA ports if there are any, else the
    physical Ethernet interfaces (NCCL's socket transport), not counting the
    netdevs of RDMA devices."""
    return rdma_nics(root) or ethernet_nics(root, rdma_pcis(root))


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))
