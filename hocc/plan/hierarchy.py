"""A uniform hierarchy as a mixed-radix grid of coordinates.

Level 0 is the host (coordinate: index of the rank among its host's ranks),
level 1 the switch (index of the host under its switch), level 2 the cluster
(index of the switch). Levels of size 1 are dropped. A rank's block position
in HO-Ring's packed layout reads its coordinates as digits, level 0 most
significant, so that every level's segments are contiguous.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hocc.topology import TIERS, Topology


@dataclass(frozen=True)
class Grid:
    radices: tuple[int, ...]
    tiers: tuple[str, ...]
    coords: dict[int, tuple[int, ...]]

    @property
    def depth(self) -> int:
        return len(self.radices)

    def position(self, coord: tuple[int, ...]) -> int:
        pos = 0
        for x, r in zip(coord, self.radices, strict=True):
            pos = pos * r + x
        return pos

    def rank_at(self) -> dict[tuple[int, ...], int]:
        return {c: r for r, c in self.coords.items()}

    def groups(self, level: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Groups at `level`: (coordinates with that level's digit set to 0, members by digit)."""
        at = self.rank_at()
        others = [range(r) if i != level else range(1) for i, r in enumerate(self.radices)]
        out = []
        for base in itertools.product(*others):
            members = []
            for x in range(self.radices[level]):
                c = list(base)
                c[level] = x
                members.append(at[tuple(c)])
            out.append((tuple(base), tuple(members)))
        return out


def build_grid(topo: Topology) -> Grid | None:
    """The grid of a topology (ranks 0..W-1), or None when it is not uniform
    (hosts of different sizes, switches with different host counts)."""
    switches = topo.switch_groups()
    hosts_per_switch = {len(s) for s in switches}
    ranks_per_host = {len(h) for s in switches for h in s}
    if len(hosts_per_switch) != 1 or len(ranks_per_host) != 1:
        return None
    g_n, h_n, s_n = ranks_per_host.pop(), hosts_per_switch.pop(), len(switches)
    full = {}
    for s, hosts in enumerate(switches):
        for h, ranks in enumerate(hosts):
            for g, r in enumerate(ranks):
                full[r] = (g, h, s)
    keep = [i for i, n in enumerate((g_n, h_n, s_n)) if n > 1]
    radices = tuple((g_n, h_n, s_n)[i] for i in keep)
    tiers = tuple(TIERS[i] for i in keep)
    coords = {r: tuple(c[i] for i in keep) for r, c in full.items()}
    return Grid(radices, tiers, coords)
