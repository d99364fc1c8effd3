"""The cluster as a graph: ranks on hosts, hosts under switches, switches on a core.

Nodes are ("rank", r), ("host", name), ("switch", name) and ("core", "core");
edges carry the tier ("host", "nic", "trunk") of the link they stand for. Every
query the planner needs (host groups, rails, switch groups, host-by-host order)
is derived from the graph, for the world or for any subset of its ranks.

A host has NICs (one on the CPU testbed, one per GPU on rail-optimized
DGX/HGX machines) and each rank sends through the NIC nearest to it (the
rank node's "nic" attribute, an index into its host's NICs). Its ranks talk
to each other over a 'shared' fabric (one link all of them share: loopback,
PCIe, shared memory) or through an 'nvswitch' (each rank its own link of the
host tier's rate into a non-blocking switch).
This module imports neither torch nor CUDA.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from hocc.topology.links import LinkModel

FABRICS = ("shared", "nvswitch")


@dataclass(frozen=True)
class HostInfo:
    """A host: its ranks, and its NICs. nic_of[i] is the NIC of ranks[i]
    (empty: the ranks split over the NICs in contiguous blocks, rank i of G on
    NIC i * nics // G: one NIC per GPU when nics == G). nic_names, when known
    (detection), name the NICs ('mlx5_0', ...)."""

    name: str
    switch: str
    ranks: tuple[int, ...]
    nics: int = 1
    nic_of: tuple[int, ...] = ()
    fabric: str = "shared"
    nic_names: tuple[str, ...] = ()

    def nic_map(self) -> tuple[int, ...]:
        """The NIC of each of `ranks`, in that order (the default map filled in)."""
        if self.nic_of:
            return self.nic_of
        g = len(self.ranks)
        return tuple(i * self.nics // g for i in range(g)) if g else ()

    def check(self) -> None:
        if not isinstance(self.nics, int) or self.nics < 1:
            raise ValueError(f"host {self.name!r}: nics must be a whole number >= 1, got {self.nics!r}")
        if self.fabric not in FABRICS:
            raise ValueError(f"host {self.name!r}: unknown fabric {self.fabric!r}; use one of {FABRICS}")
        if self.nic_of and len(self.nic_of) != len(self.ranks):
            raise ValueError(f"host {self.name!r}: nic_of lists {len(self.nic_of)} NICs for "
                             f"{len(self.ranks)} ranks; give one NIC index per rank, in the order of 'ranks'")
        bad = [n for n in self.nic_of if not 0 <= n < self.nics]
        if bad:
            raise ValueError(f"host {self.name!r}: NIC index(es) {bad} outside 0..{self.nics - 1} ({self.nics} NICs)")
        if self.nic_names and len(self.nic_names) != self.nics:
            raise ValueError(f"host {self.name!r}: {len(self.nic_names)} NIC names for {self.nics} NICs")


class Topology:
    """Ranks grouped into hosts and hosts into switches, with link parameters."""

    def __init__(self, hosts: Sequence[HostInfo], links: LinkModel | None = None) -> None:
        self.links = links or LinkModel()
        self.cost: dict[str, Any] | None = None  # a file's calibrated 'cost' section (hocc.plan.cost.CostParams)
        self._hosts: list[HostInfo] | None = None
        self._world: int | None = None
        self._switch_groups: list[list[tuple[int, ...]]] | None = None
        self.graph: nx.Graph = nx.Graph()
        self.graph.add_node(("core", "core"), kind="core")
        seen: set[int] = set()
        for h in hosts:
            if not h.ranks:
                raise ValueError(f"host {h.name!r} has no ranks; drop it or give it ranks")
            self.graph.add_node(("switch", h.switch), kind="switch")
            self.graph.add_edge(("switch", h.switch), ("core", "core"), tier="trunk")
            if ("host", h.name) in self.graph:
                raise ValueError(f"host {h.name!r} listed twice")
            h.check()
            self.graph.add_node(("host", h.name), kind="host", nics=h.nics, fabric=h.fabric,
                                nic_names=h.nic_names)
            self.graph.add_edge(("host", h.name), ("switch", h.switch), tier="nic")
            for r, nic in zip(h.ranks, h.nic_map(), strict=True):
                if r in seen:
                    raise ValueError(f"rank {r} is placed on two hosts")
                seen.add(r)
                self.graph.add_node(("rank", r), kind="rank", nic=nic)
                self.graph.add_edge(("rank", r), ("host", h.name), tier="host")
        if seen != set(range(len(seen))):
            missing = sorted(set(range(max(seen, default=-1) + 1)) - seen)
            raise ValueError(f"ranks must be 0..{len(seen) - 1} with none missing; missing {missing}")

    # -- derived views -------------------------------------------------------
    @property
    def world_size(self) -> int:
        if self._world is None:
            self._world = sum(1 for n in self.graph if n[0] == "rank")
        return self._world

    def host_infos(self) -> list[HostInfo]:
        """Hosts with their ranks sorted, ordered switch by switch, then by lowest rank."""
        if self._hosts is None:
            self._hosts = self._collect_hosts()
        return list(self._hosts)

    def _collect_hosts(self) -> list[HostInfo]:
        out = []
        for sw in self._switch_names():
            hosts = [n[1] for n in self.graph.neighbors(("switch", sw)) if n[0] == "host"]
            for h in hosts:
                ranks = tuple(sorted(n[1] for n in self.graph.neighbors(("host", h)) if n[0] == "rank"))
                out.append(self._host_info(h, sw, ranks))
        return sorted(out, key=lambda h: (self._switch_key(h.switch), h.ranks[0]))

    def _host_info(self, name: str, switch: str, ranks: tuple[int, ...],
                   renumber: dict[int, int] | None = None) -> HostInfo:
        """A host's info with its ranks in the given order (renumbered when asked)."""
        attrs = self.graph.nodes[("host", name)]
        nics = attrs.get("nics", 1)
        nic_of = tuple(self.graph.nodes[("rank", r)].get("nic", 0) for r in ranks)
        new = tuple(renumber[r] for r in ranks) if renumber is not None else ranks
        default = HostInfo(name, switch, new, nics).nic_map()
        return HostInfo(name, switch, new, nics, () if nic_of == default else nic_of,
                        attrs.get("fabric", "shared"), tuple(attrs.get("nic_names", ())))

    def nic_of(self, rank: int) -> int:
        """The index (on its host) of the NIC rank `rank` sends through."""
        self.host_of(rank)
        return int(self.graph.nodes[("rank", rank)].get("nic", 0))

    def nics_of(self, host: str) -> int:
        return int(self.graph.nodes[("host", host)].get("nics", 1))

    def fabric_of(self, host: str) -> str:
        return str(self.graph.nodes[("host", host)].get("fabric", "shared"))

    def _switch_names(self) -> list[str]:
        return [n[1] for n in self.graph.neighbors(("core", "core"))]

    def _switch_key(self, sw: str) -> int:
        return min(int(n[1]) for h in self.graph.neighbors(("switch", sw)) if h[0] == "host"
                   for n in self.graph.neighbors(h) if n[0] == "rank")

    def host_of(self, rank: int) -> str:
        if ("rank", rank) not in self.graph:
            raise KeyError(f"rank {rank} is not in this topology of {self.world_size} ranks")
        for n in self.graph.neighbors(("rank", rank)):
            if n[0] == "host":
                return str(n[1])
        raise KeyError(f"rank {rank} is not in this topology")

    def switch_of(self, rank: int) -> str:
        host = self.host_of(rank)
        return str(next(n[1] for n in self.graph.neighbors(("host", host)) if n[0] == "switch"))

    def host_groups(self, ranks: Iterable[int] | None = None) -> list[tuple[int, ...]]:
        """Ranks of each host (restricted to `ranks`), host-by-host order."""
        keep = None if ranks is None else set(ranks)
        groups = [tuple(r for r in h.ranks if keep is None or r in keep) for h in self.host_infos()]
        return [g for g in groups if g]

    def switch_groups(self, ranks: Iterable[int] | None = None) -> list[list[tuple[int, ...]]]:
        """Host groups under each switch (restricted to `ranks`)."""
        if ranks is None:
            if self._switch_groups is None:
                self._switch_groups = self._switch_groups_of(None)
            return [list(s) for s in self._switch_groups]
        return self._switch_groups_of(set(ranks))

    def _switch_groups_of(self, keep: set[int] | None) -> list[list[tuple[int, ...]]]:
        by_switch: dict[str, list[tuple[int, ...]]] = {}
        for h in self.host_infos():
            g = tuple(r for r in h.ranks if keep is None or r in keep)
            if g:
                by_switch.setdefault(h.switch, []).append(g)
        return list(by_switch.values())

    def rails(self, ranks: Iterable[int] | None = None) -> list[tuple[int, ...]]:
        """Rail g: the g-th rank (in rank order) of every host that has one."""
        hosts = self.host_groups(ranks)
        width = max((len(h) for h in hosts), default=0)
        return [tuple(h[g] for h in hosts if g < len(h)) for g in range(width)]

    def ordered_ranks(self, ranks: Iterable[int] | None = None) -> list[int]:
        """Host by host, switch by switch: the order of a topology-aware ring."""
        return [r for h in self.host_groups(ranks) for r in h]

    def restrict(self, ranks: Sequence[int]) -> Topology:
        """The topology of a sub-group, renumbered: group rank i is ranks[i]."""
        index = {r: i for i, r in enumerate(ranks)}
        if len(index) != len(ranks):
            raise ValueError("sub-group ranks must be distinct")
        for r in ranks:
            self.host_of(r)
        hosts = [self._host_info(h.name, h.switch, tuple(sorted((r for r in h.ranks if r in index),
                                                                  key=index.__getitem__)), index)
                 for h in self.host_infos()]
        sub = Topology([h for h in hosts if h.ranks], self.links)
        sub.cost = self.cost
        return sub

    def shape(self) -> str:
        """Compact description, e.g. '2x4', '2x2x2', '3+5'."""
        sw = self.switch_groups()
        sizes = [len(h) for s in sw for h in s]
        if len(set(sizes)) == 1:
            if len(sw) > 1 and len({len(s) for s in sw}) == 1:
                return f"{len(sw)}x{len(sw[0])}x{sizes[0]}"
            return f"{len(sizes)}x{sizes[0]}"
        return "+".join(str(s) for s in sizes)

    # -- (de)serialization ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"hosts": [_host_dict(h) for h in self.host_infos()], "links": self.links.to_dict()}
        if self.cost:
            d["cost"] = self.cost
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Topology:
        if "hosts" not in d or not isinstance(d["hosts"], list):
            raise ValueError("a topology file needs a 'hosts' list: [{name, ranks, switch?}, ...]")
        hosts = []
        for i, h in enumerate(d["hosts"]):
            if "ranks" not in h:
                raise ValueError(f"host #{i} in the topology file has no 'ranks' list")
            nics = h.get("nics", 1)
            if isinstance(nics, list):  # NIC names
                names, nics = tuple(str(n) for n in nics), len(nics)
            else:
                names, nics = (), int(nics)
            hosts.append(HostInfo(str(h.get("name", f"host{i}")), str(h.get("switch", "switch0")),
                                  tuple(int(r) for r in h["ranks"]), nics,
                                  tuple(int(n) for n in h.get("nic_of", ()) or ()),
                                  str(h.get("fabric", "shared")), names))
        links = LinkModel.from_dict(d.get("links", {}) or {})
        topo = Topology(hosts, links)
        cost = d.get("cost")
        if cost is not None and not isinstance(cost, dict):
            raise ValueError("a topology file's 'cost' section must be a mapping (what hocc calibrate writes)")
        topo.cost = cost or None
        return topo

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topology) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self) -> str:
        return f"Topology({self.shape()}, world={self.world_size})"


def _host_dict(h: HostInfo) -> dict[str, Any]:
    """A host's file entry; the NIC fields only where they differ from the
    CPU testbed's one shared NIC (so its files stay as they were)."""
    d: dict[str, Any] = {"name": h.name, "switch": h.switch, "ranks": list(h.ranks)}
    if h.nics != 1 or h.nic_names:
        d["nics"] = list(h.nic_names) if h.nic_names else h.nics
    if h.nic_of:
        d["nic_of"] = list(h.nic_of)
    if h.fabric != "shared":
        d["fabric"] = h.fabric
    return d


def with_nics(topo: Topology, nics: int | None = None, fabric: str | None = None) -> Topology:
    """`topo` with every host given `nics` NICs (ranks split over them in
    blocks) and/or the `fabric`; the links and cost section are kept."""
    hosts = [HostInfo(h.name, h.switch, h.ranks, nics if nics is not None else h.nics,
                      () if nics is not None else h.nic_of, fabric or h.fabric,
                      () if nics is not None else h.nic_names)
             for h in topo.host_infos()]
    out = Topology(hosts, topo.links)
    out.cost = topo.cost
    return out


# -- synthetic builders ------------------------------------------------------
def uniform(hosts: int, ranks_per_host: int, switches: int = 1, placement: str = "block",
            links: LinkModel | None = None) -> Topology:
    """`hosts` hosts of `ranks_per_host` ranks spread evenly over `switches` switches.

    placement 'block': ranks numbered host by host; 'scattered': rank r on host r mod hosts.
    """
    if hosts < 1 or ranks_per_host < 1 or switches < 1:
        raise ValueError("hosts, ranks_per_host and switches must be >= 1")
    if hosts % switches:
        raise ValueError(f"{hosts} hosts do not spread evenly over {switches} switches")
    world = hosts * ranks_per_host
    if placement == "block":
        per_host = [tuple(range(h * ranks_per_host, (h + 1) * ranks_per_host)) for h in range(hosts)]
    elif placement == "scattered":
        per_host = [tuple(range(h, world, hosts)) for h in range(hosts)]
    else:
        raise ValueError(f"unknown placement {placement!r}; use 'block' or 'scattered'")
    per_switch = hosts // switches
    infos = [HostInfo(f"host{h}", f"switch{h // per_switch}", per_host[h]) for h in range(hosts)]
    return Topology(infos, links)


def from_sizes(sizes: Sequence[int], links: LinkModel | None = None) -> Topology:
    """Hosts of the given rank counts under one switch, numbered host by host ('3+5')."""
    infos, start = [], 0
    for i, n in enumerate(sizes):
        infos.append(HostInfo(f"host{i}", "switch0", tuple(range(start, start + n))))
        start += n
    return Topology(infos, links)


def from_hostnames(hostnames: Sequence[str], links: LinkModel | None = None) -> Topology:
    """What a process group reports: rank r runs on hostnames[r]."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hostnames):
        by_host.setdefault(h, []).append(r)
    return Topology([HostInfo(h, "switch0", tuple(rs)) for h, rs in by_host.items()], links)
