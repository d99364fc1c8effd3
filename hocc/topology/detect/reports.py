"""The job's Topology from every rank's host report (torch-free: the caller
exchanges the reports, e.g. as JSON through the store).

Ranks are grouped by hostname; a host's NICs, the NIC each rank sends
through (the NIC nearest the GPU it uses), and its fabric come from that
host's report. Whatever a report lacks falls back to what hostname grouping
alone gives (one NIC, a shared fabric, the default rates), and one log line
says what could not be seen where."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hocc.topology.links import LinkModel
from hocc.topology.model import HostInfo, Topology

log = logging.getLogger("hocc.topology")


def _nic_of_rank(rep: dict[str, Any] | None, local: int, nics: list[dict[str, Any]]) -> int | None:
    """The index, in the host's NIC list, of the NIC nearest the GPU this rank
    uses: by the rank's own report (under CUDA_VISIBLE_DEVICES each rank may
    see only its GPU, as device 0), its device defaulting to its local rank."""
    if not rep or rep.get("gpu_nic") is None or not rep.get("nics"):
        return None
    device = rep.get("device")
    device = device if isinstance(device, int) else local
    if not 0 <= device < len(rep["gpu_nic"]):
        return None
    name = rep["nics"][rep["gpu_nic"][device]].get("name")
    names = [n.get("name") for n in nics]
    return names.index(name) if name in names else None


def from_host_reports(hostnames: Sequence[str], reports: Sequence[dict[str, Any] | None],
                      links: LinkModel | None = None, warn: Callable[[str], None] | None = None) -> Topology:
    """Rank r runs on hostnames[r] and reported reports[r] (None: it could not
    detect anything). NIC rates replace the links' NIC bandwidth when every
    host reports them (the slowest host's rate: a ring runs at its pace)."""
    if len(hostnames) != len(reports):
        raise ValueError(f"{len(hostnames)} hostnames but {len(reports)} host reports; give one of each per rank")
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hostnames):
        by_host.setdefault(h, []).append(r)
    links = links or LinkModel()
    infos, rates, unseen = [], [], {}
    for host, ranks in by_host.items():
        rep = next((reports[r] for r in ranks if reports[r]), None) or {}
        gaps = list(rep.get("unseen", ["anything"] if not rep else []))
        nics = list(rep.get("nics") or [])
        gpu_nic = rep.get("gpu_nic")
        nic_of: tuple[int, ...] = ()
        if nics and gpu_nic is not None:
            picks = [_nic_of_rank(reports[r], i, nics) for i, r in enumerate(ranks)]
            if all(p is not None for p in picks):
                nic_of = tuple(p for p in picks if p is not None)
            elif "GPU-to-NIC affinity" not in gaps:
                gaps.append("the GPU of each rank")
        count = max(1, len(nics))
        fabric = "nvswitch" if rep.get("nvswitch") else "shared"
        names = tuple(str(n.get("name", f"nic{i}")) for i, n in enumerate(nics)) if nics else ()
        infos.append(HostInfo(host, "switch0", tuple(ranks), count, nic_of, fabric, names))
        rates.append(min((float(n["rate"]) for n in nics if n.get("rate")), default=0.0) if nics else 0.0)
        if gaps:
            unseen[host] = gaps
    if rates and all(rates):
        links = links.with_tier("nic", replace(links.nic, bandwidth=min(rates)))
    if unseen:
        what = sorted({g for gaps in unseen.values() for g in gaps})
        hosts = list(unseen)
        shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
        (warn or log.warning)(f"hocc: topology detection could not see {', '.join(what)} on {shown}; "
                              "those hosts are grouped by hostname with one NIC and a shared fabric where unseen "
                              "(set HOCC_TOPOLOGY to say more)")
    return Topology(infos, links)
