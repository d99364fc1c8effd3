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
from typing import Any

from hocc.topology.links import Link, LinkModel
from hocc.topology.model import HostInfo, Topology

log = logging.getLogger("hocc.topology")


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
            devices = [reports[r].get("device") if reports[r] else None for r in ranks]
            devices = [d if isinstance(d, int) else i for i, d in enumerate(devices)]  # default: local rank
            if all(0 <= d < len(gpu_nic) for d in devices):
                nic_of = tuple(int(gpu_nic[d]) for d in devices)
            elif "GPU-to-NIC affinity" not in gaps:
                gaps.append(f"the GPU of each rank ({len(ranks)} ranks, {len(gpu_nic)} GPUs)")
        count = max(1, len(nics))
        fabric = "nvswitch" if rep.get("nvswitch") else "shared"
        names = tuple(str(n.get("name", f"nic{i}")) for i, n in enumerate(nics)) if nics else ()
        infos.append(HostInfo(host, "switch0", tuple(ranks), count, nic_of, fabric, names))
        rates.append(min((float(n["rate"]) for n in nics if n.get("rate")), default=0.0) if nics else 0.0)
        if gaps:
            unseen[host] = gaps
    if rates and all(rates):
        links = links.with_tier("nic", Link(min(rates), links.nic.latency))
    if unseen:
        what = sorted({g for gaps in unseen.values() for g in gaps})
        hosts = list(unseen)
        shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
        (warn or log.warning)(f"hocc: topology detection could not see {', '.join(what)} on {shown}; "
                              "those hosts are grouped by hostname with one NIC and a shared fabric where unseen "
                              "(set HOCC_TOPOLOGY to say more)")
    return Topology(infos, links)
